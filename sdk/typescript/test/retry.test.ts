// Unit tests of the retry helper against a scripted in-process HTTP server
// (./scripted-server.ts), which records every request it gets.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  createClient,
  idempotent,
  OncekeyProblemError,
  retryDelayMs,
  type NewOrder,
} from "../dist/index.js";
import { drop, problem, reply, scripted, type Seen } from "./scripted-server.js";

const SEED: NewOrder = { items: [{ sku: "SKU-1", qty: 2 }], amount: 1200, currency: "RUB" };
const ORDER = {
  id: "01a236fb-6340-7767-a7b8-fd2b954bc880",
  status: "created",
  ...SEED,
  created_at: "2026-12-02T13:39:34.336485Z",
};
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
// Small delays so the suite stays fast; the logic is the same at any scale.
const FAST = { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 20 };

function client(url: string, retry = FAST) {
  return createClient({ baseUrl: url, apiKey: "ok_unit", retry });
}

function assertOneKey(seen: Seen[]): string {
  const key = seen[0]?.key;
  assert.match(key ?? "", UUID);
  for (const s of seen) assert.equal(s.key, key, "every attempt must carry the operation's key");
  return key!;
}

describe("idempotent retries", () => {
  test("503, then 202, then 201: retried with the same key, returns the 201", async () => {
    const { url, seen } = await scripted(
      problem(503, "unavailable", { "Retry-After": "0" }),
      problem(202, "request-in-progress", { "Retry-After": "0" }),
      reply(201, ORDER, { Location: `/orders/${ORDER.id}` }),
    );
    const order = await client(url).createOrder(SEED);
    assert.deepEqual(order, ORDER);
    assert.equal(seen.length, 3);
    assertOneKey(seen);
    for (const s of seen) {
      assert.equal(s.method, "POST");
      assert.equal(s.url, "/orders");
      assert.deepEqual(JSON.parse(s.body), SEED, "every attempt must send the same request");
    }
  });

  for (const [status, type] of [
    [400, "validation-error"],
    [409, "idempotency-key-mismatch"],
    [422, "unknown-currency"],
  ] as const) {
    test(`${status} is final: exactly one request, OncekeyProblemError`, async () => {
      const { url, seen } = await scripted(problem(status, type), reply(201, ORDER));
      await assert.rejects(client(url).createOrder(SEED), (err: unknown) => {
        assert.ok(err instanceof OncekeyProblemError);
        assert.equal(err.status, status);
        assert.equal(err.problem.type, `https://oncekey.dev/problems/${type}`);
        return true;
      });
      assert.equal(seen.length, 1);
    });
  }

  test("a dropped connection is retried with the same key", async () => {
    const { url, seen } = await scripted(drop, reply(201, ORDER));
    assert.deepEqual(await client(url).createOrder(SEED), ORDER);
    assert.equal(seen.length, 2);
    assertOneKey(seen);
  });

  test("attempts are bounded: a persistent 503 gives up after maxAttempts", async () => {
    const { url, seen } = await scripted(problem(503, "unavailable", { "Retry-After": "0" }));
    await assert.rejects(client(url, { ...FAST, maxAttempts: 3 }).createOrder(SEED), (err: unknown) => {
      assert.ok(err instanceof OncekeyProblemError);
      assert.equal(err.status, 503);
      assert.equal(err.problem.type, "https://oncekey.dev/problems/unavailable");
      return true;
    });
    assert.equal(seen.length, 3);
    assertOneKey(seen);
  });

  test("attempts are bounded: a persistent network error is rethrown after maxAttempts", async () => {
    const { url, seen } = await scripted(drop);
    await assert.rejects(client(url, { ...FAST, maxAttempts: 3 }).createOrder(SEED), TypeError);
    assert.equal(seen.length, 3);
    assertOneKey(seen);
  });

  test("the default is 5 attempts", async () => {
    const { url, seen } = await scripted(problem(500, "internal-error"));
    const c = createClient({ baseUrl: url, apiKey: "k", retry: { baseDelayMs: 1, maxDelayMs: 5 } });
    await assert.rejects(c.createOrder(SEED), OncekeyProblemError);
    assert.equal(seen.length, 5);
  });

  // Without the cap this would wait an hour; the timeout turns that into a failure.
  test("Retry-After is capped by maxDelayMs", { timeout: 5_000 }, async () => {
    const { url, seen } = await scripted(problem(503, "unavailable", { "Retry-After": "3600" }), reply(201, ORDER));
    const started = Date.now();
    await client(url, { ...FAST, maxDelayMs: 30 }).createOrder(SEED);
    assert.ok(Date.now() - started < 2_000, "waited for Retry-After instead of maxDelayMs");
    assert.equal(seen.length, 2);
  });

  test("distinct logical operations get distinct keys", async () => {
    const { url, seen } = await scripted(reply(201, ORDER));
    const c = client(url);
    await c.createOrder(SEED);
    await c.createOrder(SEED);
    assert.equal(seen.length, 2);
    assert.match(seen[0]!.key ?? "", UUID);
    assert.match(seen[1]!.key ?? "", UUID);
    assert.notEqual(seen[0]!.key, seen[1]!.key);
  });

  test("a caller's key is used as given, on every attempt", async () => {
    const { url, seen } = await scripted(problem(503, "unavailable", { "Retry-After": "0" }), reply(201, ORDER));
    await client(url).createOrder(SEED, { idempotencyKey: "order-42" });
    assert.deepEqual(seen.map((s) => s.key), ["order-42", "order-42"]);
  });

  test("the generic helper works with raw fetch", async () => {
    const { url, seen } = await scripted(problem(202, "request-in-progress", { "Retry-After": "0" }), reply(201, ORDER));
    const res = await idempotent(
      (key) =>
        fetch(`${url}/orders`, {
          method: "POST",
          headers: { "Idempotency-Key": key, "Content-Type": "application/json" },
          body: JSON.stringify(SEED),
        }),
      FAST,
    );
    assert.equal(res.status, 201);
    assert.deepEqual(await res.json(), ORDER);
    assert.equal(seen.length, 2);
    assertOneKey(seen);
  });

  test("an AbortError (the caller gave up) is not retried", async () => {
    let calls = 0;
    await assert.rejects(
      idempotent(async (): Promise<Response> => {
        calls++;
        throw new DOMException("aborted", "AbortError");
      }, FAST),
      { name: "AbortError" },
    );
    assert.equal(calls, 1);
  });

  test("GETs are retried too, without a key", async () => {
    const { url, seen } = await scripted(problem(503, "unavailable", { "Retry-After": "0" }), reply(200, ORDER));
    assert.deepEqual(await client(url).getOrder(ORDER.id), ORDER);
    assert.deepEqual(seen.map((s) => [s.method, s.url, s.key]), [
      ["GET", `/orders/${ORDER.id}`, undefined],
      ["GET", `/orders/${ORDER.id}`, undefined],
    ]);
  });

  test("a non-problem error body still becomes an OncekeyProblemError", async () => {
    const { url } = await scripted((_req, res) => {
      res.writeHead(404, { "Content-Type": "text/plain" });
      res.end("nothing here");
    });
    await assert.rejects(client(url).getOrder("x"), (err: unknown) => {
      assert.ok(err instanceof OncekeyProblemError);
      assert.equal(err.status, 404);
      assert.equal(err.problem.type, "about:blank");
      assert.equal(err.problem.detail, "nothing here");
      return true;
    });
  });
});

describe("retryDelayMs", () => {
  const opts = { maxAttempts: 5, baseDelayMs: 100, maxDelayMs: 1_000 };

  test("full jitter: uniform in [0, base * 2^(attempt-1)), capped", () => {
    const justUnder = () => 0.999999;
    assert.equal(retryDelayMs(1, opts, null, () => 0), 0);
    assert.equal(retryDelayMs(1, opts, null, justUnder), 99);
    assert.equal(retryDelayMs(3, opts, null, justUnder), 399);
    assert.equal(retryDelayMs(10, opts, null, justUnder), 999);
  });

  test("Retry-After seconds win over backoff, capped by maxDelayMs", () => {
    assert.equal(retryDelayMs(1, opts, "0"), 0);
    assert.equal(retryDelayMs(4, opts, "1"), 1_000);
    assert.equal(retryDelayMs(1, opts, "3600"), 1_000);
  });

  test("an unparseable Retry-After falls back to backoff", () => {
    assert.equal(retryDelayMs(2, opts, "Wed, 21 Oct 2015 07:28:00 GMT", () => 0.5), 100);
  });
});
