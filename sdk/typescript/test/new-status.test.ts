// The statuses of orders, payments and refunds are open enums (x-open-enum
// in openapi.yaml): a release may add a value, on the promise that an SDK
// built before it reads the new value without an error. These tests keep
// that promise the way it is broken in practice: an old SDK against a newer
// server.
//
// The old SDK is built from two contracts. The released one
// (api/openapi.released.yaml, 0.1.0) is what users run today, but it has
// orders alone, with the closed status enum ["created"], so with it only an
// order can be read: its types are generated here by scripts/generate.mjs
// into test-generated/released.d.ts (`npm run build:test`), and the
// openapi-fetch client typed with them reads it. openapi.yaml is the
// previous release once the next one ships, and has orders, payments and
// refunds: the SDK as it is (../dist, typed by src/schema.d.ts, which
// `make sdk/check` keeps generated from it) reads all three.
//
// The newer server answers with ../../../client/testdata/new-status.json:
// an order, a payment and a refund in the status "disputed". The Go SDK's
// test (client/newstatus_test.go) serves the same file and checks every
// answer against openapi.yaml with "disputed" added to each open enum, the
// contract of that newer server; it also checks that openapi.yaml itself
// rejects them, so the status is one neither SDK knows.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import createFetchClient from "openapi-fetch";
import { createClient, type Order, type Payment, type Refund } from "../dist/index.js";
import type { components as ReleasedComponents, paths as ReleasedPaths } from "../test-generated/released.js";
import { problem, reply, scripted } from "./scripted-server.js";

const NEW_STATUS = "disputed";

interface Answers {
  order: Order;
  payment: Payment;
  refund: Refund;
}
const answers = JSON.parse(
  readFileSync(new URL("../../../client/testdata/new-status.json", import.meta.url), "utf8"),
) as Answers;

// At compile time: the released contract's Order.status is "created" and
// nothing else, so what the first test reads is a status those types say
// cannot happen. (A release that makes it open, with payments and refunds,
// fails here: read a payment and a refund with the released types too.)
// The types of openapi.yaml take any status.
type ReleasedStatus = ReleasedComponents["schemas"]["Order"]["status"];
const releasedIsClosed: [ReleasedStatus] extends ["created"] ? true : ReleasedStatus = true;
const open: [Order["status"], Payment["status"], Refund["status"]] = [NEW_STATUS, NEW_STATUS, NEW_STATUS];

/** Where a caller's switch over an order status of the released SDK goes. */
function releasedBranch(status: ReleasedStatus): string {
  switch (status) {
    case "created":
      return status;
    default: // what a caller does with a status it does not know
      return "default";
  }
}

/** Where a caller's switch over an order status goes. */
function orderBranch(status: Order["status"]): string {
  switch (status) {
    case "created":
    case "cancelled":
      return status;
    default: // what a caller does with a status it does not know
      return "default";
  }
}

/** Where a caller's switch over a payment or refund status goes. */
function paymentBranch(status: Payment["status"] | Refund["status"]): string {
  switch (status) {
    case "pending":
    case "succeeded":
    case "failed":
      return status;
    default:
      return "default";
  }
}

/** A newer server: each answer with 200 on GET of its path, a 404 problem for anything else. */
function newerServer() {
  const paths = new Map<string, unknown>([
    [`/orders/${answers.order.id}`, answers.order],
    [`/payments/${answers.payment.id}`, answers.payment],
    [`/refunds/${answers.refund.id}`, answers.refund],
  ]);
  return scripted((req, res) => {
    const body = req.method === "GET" ? paths.get(req.url ?? "") : undefined;
    (body === undefined ? problem(404, "not-found") : reply(200, body))(req, res);
  });
}

describe("an old SDK against a server with a new status", () => {
  test("the answers are an order, a payment and a refund in the new status", () => {
    assert.equal(releasedIsClosed, true);
    assert.deepEqual(open, [NEW_STATUS, NEW_STATUS, NEW_STATUS]);
    for (const [name, body] of Object.entries(answers)) {
      assert.equal((body as { status: string }).status, NEW_STATUS, `the ${name}'s status`);
    }
  });

  test("the SDK built from the released contract reads an order in it", async () => {
    const server = await newerServer();
    const api = createFetchClient<ReleasedPaths>({ baseUrl: server.url });
    const { data, error, response } = await api.GET("/orders/{id}", { params: { path: { id: answers.order.id } } });
    assert.equal(error, undefined, "no error");
    assert.equal(response.status, 200);
    assert.ok(data, "the order is decoded");
    assert.deepEqual(data, answers.order, "the order as the server sent it");
    // Its types say "created": widened to compare with what came.
    const status: string = data.status;
    assert.equal(status, NEW_STATUS);
    assert.equal(releasedBranch(data.status), "default", "a switch over the status takes its default");
    assert.deepEqual(
      server.seen.map((s) => [s.method, s.url]),
      [["GET", `/orders/${answers.order.id}`]],
    );
  });

  test("the SDK built from openapi.yaml reads an order, a payment and a refund in it", async () => {
    const server = await newerServer();
    const client = createClient({ baseUrl: server.url, apiKey: "ok_unit" });

    const order = await client.getOrder(answers.order.id);
    assert.deepEqual(order, answers.order);
    assert.equal(orderBranch(order.status), "default", "a switch over the order's status takes its default");
    assert.equal(order.status, NEW_STATUS);

    const payment = await client.getPayment(answers.payment.id);
    assert.deepEqual(payment, answers.payment);
    assert.equal(paymentBranch(payment.status), "default", "a switch over the payment's status takes its default");
    assert.equal(payment.status, NEW_STATUS);

    const refund = await client.getRefund(answers.refund.id);
    assert.deepEqual(refund, answers.refund);
    assert.equal(paymentBranch(refund.status), "default", "a switch over the refund's status takes its default");
    assert.equal(refund.status, NEW_STATUS);

    assert.deepEqual(
      server.seen.map((s) => [s.method, s.url]),
      [
        ["GET", `/orders/${answers.order.id}`],
        ["GET", `/payments/${answers.payment.id}`],
        ["GET", `/refunds/${answers.refund.id}`],
      ],
      "one attempt each: none was retried",
    );
  });
});
