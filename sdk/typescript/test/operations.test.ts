// Every operation of openapi.yaml has a method of its own, named after its
// operationId, so that a new operation cannot be left to `idempotent` by
// oversight; and the methods of payments, bonuses and the operations
// endpoints send what the contract says, against a scripted server.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  createClient,
  type BonusEntryResult,
  type NewBonusEntry,
  type NewPayment,
  type OncekeyClient,
  type operations,
  type Payment,
} from "../dist/index.js";
import { isProblem } from "./problems.js";
import { accepted, drop, problem, reply, scripted, type Seen } from "./scripted-server.js";

// At compile time: tsc fails here, naming them, if an operation of the
// generated schema (src/schema.d.ts, which `make sdk/check` keeps in step
// with openapi.yaml) has no method on OncekeyClient.
type Missing = Exclude<keyof operations, keyof OncekeyClient>;
const noneMissing: [Missing] extends [never] ? true : Missing = true;

/**
 * The operationIds of openapi.yaml, read from the file itself: each
 * operation is a method key (4 spaces in, under a path 2 spaces in) whose
 * operationId is 6 spaces in. Examples deeper in may mention an
 * operationId too; they are not operations.
 */
function operationIds(spec: string): { methods: number; ids: string[] } {
  let inPaths = false;
  let methods = 0;
  const ids: string[] = [];
  for (const line of spec.split("\n")) {
    if (/^\S/.test(line)) inPaths = line.startsWith("paths:");
    if (!inPaths) continue;
    if (/^ {4}(get|put|post|delete|options|head|patch|trace):\s*$/.test(line)) methods++;
    const id = /^ {6}operationId:\s*(\S+)\s*$/.exec(line)?.[1];
    if (id) ids.push(id);
  }
  return { methods, ids };
}

describe("one method per operation", () => {
  test("openapi.yaml's every operationId is a method of the client", () => {
    assert.equal(noneMissing, true);
    const spec = readFileSync(fileURLToPath(new URL("../../../openapi.yaml", import.meta.url)), "utf8");
    const { methods, ids } = operationIds(spec);
    assert.ok(ids.length >= 17, `read ${ids.length} operations from openapi.yaml`);
    assert.equal(ids.length, methods, "every operation of openapi.yaml has an operationId, and each was read");
    const client = createClient({ baseUrl: "http://127.0.0.1:1", apiKey: "ok_unit" }) as unknown as Record<string, unknown>;
    const missing = ids.filter((id) => typeof client[id] !== "function");
    assert.deepEqual(missing, [], "operations of openapi.yaml without a method of their own");
  });
});

// The openapi.yaml examples.
const ORDER_ID = "01a236fb-6340-7767-a7b8-fd2b954bc880";
const NEW_PAYMENT: NewPayment = { order_id: ORDER_ID, amount: 1200, currency: "RUB" };
const PENDING: Payment = {
  id: "01a23701-2b9c-7d4e-8f10-3a5b6c7d8e9f",
  status: "pending",
  ...NEW_PAYMENT,
  created_at: "2026-12-02T13:45:00.000000Z",
};
const CREDIT_BODY: NewBonusEntry = { amount: 100, reason: "welcome bonus" };
const CREDIT: BonusEntryResult = {
  entry: {
    id: "01a23720-0000-7000-8000-000000000001",
    kind: "credit",
    ...CREDIT_BODY,
    balance_after: 100,
    created_at: "2026-12-02T13:46:00.000000Z",
  },
  balance: 100,
};
const DEBIT_BODY: NewBonusEntry = { amount: 40, reason: `order ${ORDER_ID}` };
const DEBIT: BonusEntryResult = {
  entry: { ...CREDIT.entry, id: "01a23720-0000-7000-8000-000000000002", kind: "debit", ...DEBIT_BODY, balance_after: 60 },
  balance: 60,
};
const FAST = { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 20 };

function client(url: string): OncekeyClient {
  return createClient({ baseUrl: url, apiKey: "ok_unit", retry: FAST });
}

function assertOneKey(seen: Seen[]) {
  const key = seen[0]?.key;
  assert.ok(key);
  for (const s of seen) assert.equal(s.key, key, "every attempt must carry the operation's key");
}

describe("payments and bonuses", () => {
  test("createPayment: a dropped answer is retried with the key; the 202 with the pending payment is the answer", async () => {
    const { url, seen } = await scripted(drop, accepted(PENDING, { Location: `/payments/${PENDING.id}` }));
    assert.deepEqual(await client(url).createPayment(NEW_PAYMENT), PENDING);
    assert.equal(seen.length, 2);
    assertOneKey(seen);
    for (const s of seen) {
      assert.equal(s.method, "POST");
      assert.equal(s.url, "/payments");
      assert.deepEqual(JSON.parse(s.body), NEW_PAYMENT);
    }
  });

  test("createPayment: 409 payment-in-progress is final", async () => {
    const { url, seen } = await scripted(problem(409, "payment-in-progress"), accepted(PENDING));
    await assert.rejects(client(url).createPayment(NEW_PAYMENT), isProblem(409, "payment-in-progress"));
    assert.equal(seen.length, 1);
  });

  for (const [name, path, body, answer] of [
    ["createBonusCredit", "/bonus/credits", CREDIT_BODY, CREDIT],
    ["createBonusDebit", "/bonus/debits", DEBIT_BODY, DEBIT],
  ] as const) {
    test(`${name}: 503 then 201, one key, the same request`, async () => {
      const { url, seen } = await scripted(problem(503, "unavailable", { "Retry-After": "0" }), reply(201, answer));
      assert.deepEqual(await client(url)[name](body), answer);
      assert.equal(seen.length, 2);
      assertOneKey(seen);
      for (const s of seen) {
        assert.equal(s.url, path);
        assert.deepEqual(JSON.parse(s.body), body);
      }
    });
  }

  test("createBonusDebit: 422 insufficient-funds is final", async () => {
    const { url, seen } = await scripted(problem(422, "insufficient-funds"), reply(201, DEBIT));
    await assert.rejects(client(url).createBonusDebit(DEBIT_BODY), isProblem(422, "insufficient-funds"));
    assert.equal(seen.length, 1);
  });

  test("getPayment and getBonusBalance are reads: retried, without a key", async () => {
    const { url, seen } = await scripted(
      problem(503, "unavailable", { "Retry-After": "0" }),
      reply(200, PENDING, { "Retry-After": "1" }),
      reply(200, { balance: 60 }),
    );
    const c = client(url);
    assert.deepEqual(await c.getPayment(PENDING.id), PENDING);
    assert.deepEqual(await c.getBonusBalance(), { balance: 60 });
    assert.deepEqual(seen.map((s) => [s.method, s.url, s.key]), [
      ["GET", `/payments/${PENDING.id}`, undefined],
      ["GET", `/payments/${PENDING.id}`, undefined],
      ["GET", "/bonus/balance", undefined],
    ]);
  });
});

describe("open statuses", () => {
  // The statuses of orders, payments and refunds are open enums
  // (x-open-enum in openapi.yaml): a later server may answer one this SDK
  // does not know. It is handed over as it came, and the types make a
  // caller's switch keep a default for it.
  test("a status this SDK does not know is read as it came, for a default branch", async () => {
    const disputed: Payment = { ...PENDING, status: "disputed" };
    const { url } = await scripted(reply(200, disputed));
    const payment = await client(url).getPayment(disputed.id);
    assert.equal(whatToDo(payment.status), "show it as it came");
    assert.equal(payment.status, "disputed");
  });
});

/** A caller's switch over a payment's status, as the README of the SDK shows it. */
function whatToDo(status: Payment["status"]): string {
  switch (status) {
    case "pending":
      return "poll again";
    case "succeeded":
    case "failed":
      return "done";
    default:
      return "show it as it came"; // a status added after this SDK was generated
  }
}

describe("the operations endpoints", () => {
  test("getHealth and getReadiness are probes: answered as they are, not retried", async () => {
    const { url, seen } = await scripted(reply(200, { status: "ok" }), problem(503, "unavailable", { "Retry-After": "1" }));
    const c = client(url);
    assert.deepEqual(await c.getHealth(), { status: "ok" });
    await assert.rejects(c.getReadiness(), isProblem(503, "unavailable"));
    assert.deepEqual(seen.map((s) => s.url), ["/healthz", "/readyz"]);
  });

  test("getSpec and getDocs return the contract and the page as text", async () => {
    const yaml = "openapi: 3.0.3\ninfo:\n  title: Oncekey\n";
    const html = "<!DOCTYPE html>\n<title>Oncekey API reference</title>\n";
    const { url, seen } = await scripted(
      (_req, res) => {
        res.writeHead(200, { "Content-Type": "application/yaml" });
        res.end(yaml);
      },
      (_req, res) => {
        res.writeHead(200, { "Content-Type": "text/html" });
        res.end(html);
      },
    );
    const c = client(url);
    assert.equal(await c.getSpec(), yaml);
    assert.equal(await c.getDocs(), html);
    assert.deepEqual(seen.map((s) => s.url), ["/openapi.yaml", "/docs"]);
  });
});
