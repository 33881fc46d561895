// Unit tests of the retry helper against a scripted in-process HTTP server
// (./scripted-server.ts), which records every request it gets.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  createClient,
  idempotent,
  isRetryable,
  OncekeyProblemError,
  retryDelayMs,
  type NewOrder,
  type NewRefund,
  type OncekeyClient,
  type OperationOptions,
  type OrderPatch,
  type Refund,
} from "../dist/index.js";
import { isProblem } from "./problems.js";
import { accepted, drop, problem, reply, scripted, type Seen } from "./scripted-server.js";

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
      await assert.rejects(client(url).createOrder(SEED), isProblem(status, type));
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
    await assert.rejects(client(url, { ...FAST, maxAttempts: 3 }).createOrder(SEED), isProblem(503, "unavailable"));
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

  test("the generic helper against another API's shape: a form POST /v1/charges, 500 then 200", async () => {
    const charge = { id: "ch_1", object: "charge", amount: 1200, currency: "eur" };
    const { url, seen } = await scripted(
      reply(500, { error: { type: "api_error", message: "try again" } }),
      reply(200, charge),
    );
    // As sdk/typescript/README.md ("Against any API") shows it.
    const res = await idempotent(
      (key) =>
        fetch(`${url}/v1/charges`, {
          method: "POST",
          headers: {
            Authorization: "Bearer sk_test_123",
            "Idempotency-Key": key,
            "Content-Type": "application/x-www-form-urlencoded",
          },
          body: new URLSearchParams({ amount: "1200", currency: "eur", source: "tok_visa" }),
        }),
      FAST,
    );
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), charge);
    assert.equal(seen.length, 2, "the 500 is retried once");
    assertOneKey(seen);
    for (const s of seen) {
      assert.equal(s.url, "/v1/charges");
      assert.equal(s.body, "amount=1200&currency=eur&source=tok_visa");
      assert.equal(s.contentType, "application/x-www-form-urlencoded");
    }
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

// The openapi.yaml examples of a refund, pending and then final.
const PAYMENT_ID = "01a23701-2b9c-7d4e-8f10-3a5b6c7d8e9f";
const REFUND_BODY: NewRefund = { amount: 300, reason: "one item returned" };
const PENDING: Refund = {
  id: "01a23710-4d5e-7f60-8a1b-2c3d4e5f6a7b",
  payment_id: PAYMENT_ID,
  status: "pending",
  ...REFUND_BODY,
  currency: "RUB",
  created_at: "2026-12-02T13:50:01.100000Z",
};
const REFUNDED: Refund = {
  ...PENDING,
  status: "succeeded",
  provider_refund_id: "re_1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
  completed_at: "2026-12-02T13:50:01.420000Z",
};
const PATCH: OrderPatch = { amount: 1800 };
const CHANGED = { ...ORDER, amount: 1800 };
const CANCELLED = { ...ORDER, status: "cancelled", cancelled_at: "2026-12-02T13:40:00.000000Z" };

/** A method under test: how it is called, and the 4xx problems it must not retry. */
interface Method {
  name: string;
  call: (c: OncekeyClient, options?: OperationOptions) => Promise<unknown>;
  problems: [status: number, type: string][];
}

/** The unsafe methods of changing orders and refunds, and the request each must send every time. */
interface Unsafe extends Method {
  method: string;
  url: string;
  contentType: string | undefined;
  body: unknown;
  answer: unknown;
}

const UNSAFE: Unsafe[] = [
  {
    name: "updateOrder",
    call: (c, o) => c.updateOrder(ORDER.id, PATCH, o),
    problems: [[409, "order-not-modifiable"], [415, "unsupported-media-type"], [422, "unknown-currency"]],
    method: "PATCH",
    url: `/orders/${ORDER.id}`,
    contentType: "application/merge-patch+json",
    body: PATCH,
    answer: CHANGED,
  },
  {
    name: "cancelOrder",
    call: (c, o) => c.cancelOrder(ORDER.id, o),
    problems: [[409, "order-not-cancellable"], [404, "not-found"]],
    method: "DELETE",
    url: `/orders/${ORDER.id}`,
    contentType: undefined,
    body: undefined,
    answer: CANCELLED,
  },
  {
    name: "createRefund",
    call: (c, o) => c.createRefund(PAYMENT_ID, REFUND_BODY, o),
    problems: [[409, "payment-not-refundable"], [422, "refund-exceeds-payment"], [422, "too-many-refunds"]],
    method: "POST",
    url: `/payments/${PAYMENT_ID}/refunds`,
    contentType: "application/json",
    body: REFUND_BODY,
    answer: REFUNDED,
  },
];

const READS: Method[] = [
  { name: "getRefund", call: (c) => c.getRefund(PENDING.id), problems: [[404, "not-found"]] },
  { name: "listRefunds", call: (c) => c.listRefunds(PAYMENT_ID), problems: [[404, "not-found"]] },
];

describe("order changes and refunds", () => {
  for (const op of UNSAFE) {
    test(`${op.name}: dropped, 503, 202 in progress, then 200: one key for every attempt, the same request`, async () => {
      const { url, seen } = await scripted(
        drop,
        problem(503, "unavailable", { "Retry-After": "0" }),
        problem(202, "request-in-progress", { "Retry-After": "0" }),
        reply(200, op.answer),
      );
      assert.deepEqual(await op.call(client(url)), op.answer);
      assert.equal(seen.length, 4);
      assertOneKey(seen);
      for (const s of seen) {
        assert.equal(s.method, op.method);
        assert.equal(s.url, op.url);
        assert.equal(s.contentType, op.contentType);
        const body: unknown = s.body === "" ? undefined : JSON.parse(s.body);
        assert.deepEqual(body, op.body, "every attempt must send the same request");
      }
    });

    test(`${op.name}: a caller's key is used as given, on every attempt`, async () => {
      const { url, seen } = await scripted(drop, reply(200, op.answer));
      await op.call(client(url), { idempotencyKey: "op-7" });
      assert.deepEqual(seen.map((s) => s.key), ["op-7", "op-7"]);
    });

    test(`${op.name}: distinct calls get distinct keys`, async () => {
      const { url, seen } = await scripted(reply(200, op.answer));
      const c = client(url);
      await op.call(c);
      await op.call(c);
      assert.equal(seen.length, 2);
      assert.notEqual(seen[0]!.key, seen[1]!.key);
    });
  }

  for (const op of [...UNSAFE, ...READS]) {
    for (const [status, type] of op.problems) {
      test(`${op.name}: ${status} ${type} is final: exactly one request, OncekeyProblemError`, async () => {
        const { url, seen } = await scripted(problem(status, type), reply(200, REFUNDED));
        await assert.rejects(op.call(client(url)), isProblem(status, type));
        assert.equal(seen.length, 1);
      });
    }
  }

  test("createRefund resolves to the refund as accepted: a 202 with the refund is not retried", async () => {
    const { url, seen } = await scripted(
      problem(202, "request-in-progress", { "Retry-After": "0" }),
      accepted(PENDING, { Location: `/refunds/${PENDING.id}` }),
      reply(200, REFUNDED),
    );
    assert.deepEqual(await client(url).createRefund(PAYMENT_ID, REFUND_BODY), PENDING);
    assert.equal(seen.length, 2, "the in-progress 202 is retried, the accepted one is the answer");
    assertOneKey(seen);
  });

  test("createRefund after a dropped answer: the retry's 202 with the pending refund is the answer", async () => {
    const { url, seen } = await scripted(drop, accepted(PENDING, { "Idempotent-Replayed": "true" }));
    assert.deepEqual(await client(url).createRefund(PAYMENT_ID, REFUND_BODY), PENDING);
    assert.equal(seen.length, 2);
    assertOneKey(seen);
  });

  test("createRefund: a 202 in progress that outlives the retries is an OncekeyProblemError", async () => {
    const { url, seen } = await scripted(problem(202, "request-in-progress", { "Retry-After": "0" }));
    await assert.rejects(
      client(url, { ...FAST, maxAttempts: 3 }).createRefund(PAYMENT_ID, REFUND_BODY),
      isProblem(202, "request-in-progress"),
    );
    assert.equal(seen.length, 3);
    assertOneKey(seen);
  });

  test("getRefund and listRefunds are retried too, without a key", async () => {
    const { url, seen } = await scripted(
      problem(503, "unavailable", { "Retry-After": "0" }),
      reply(200, PENDING, { "Retry-After": "1" }),
      drop,
      reply(200, { items: [REFUNDED] }),
    );
    const c = client(url);
    assert.deepEqual(await c.getRefund(PENDING.id), PENDING);
    assert.deepEqual(await c.listRefunds(PAYMENT_ID), { items: [REFUNDED] });
    assert.deepEqual(seen.map((s) => [s.method, s.url, s.key]), [
      ["GET", `/refunds/${PENDING.id}`, undefined],
      ["GET", `/refunds/${PENDING.id}`, undefined],
      ["GET", `/payments/${PAYMENT_ID}/refunds`, undefined],
      ["GET", `/payments/${PAYMENT_ID}/refunds`, undefined],
    ]);
  });

  test("isRetryable tells a 202 in progress from a long operation's 202", () => {
    const response = (status: number, type: string) => new Response(null, { status, headers: { "Content-Type": type } });
    assert.equal(isRetryable(response(202, "application/problem+json")), true);
    assert.equal(isRetryable(response(202, "application/json")), false);
    assert.equal(isRetryable(response(202, "application/json; charset=utf-8")), false);
    assert.equal(isRetryable(response(503, "application/problem+json")), true);
    assert.equal(isRetryable(response(200, "application/json")), false);
    assert.equal(isRetryable(response(409, "application/problem+json")), false);
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
