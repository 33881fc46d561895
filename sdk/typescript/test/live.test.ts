// Live tests against a real Oncekey server at ONCEKEY_URL with ONCEKEY_API_KEY.
// Without ONCEKEY_URL they are skipped locally, but FAIL when CI is set: a
// skipped test in CI would look green while proving nothing.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { createClient, OncekeyProblemError, type NewOrder, type Order } from "../dist/index.js";

const url = process.env.ONCEKEY_URL ?? "";
const apiKey = process.env.ONCEKEY_API_KEY ?? "";
const inCI = (process.env.CI ?? "") !== "";

const SEED: NewOrder = { items: [{ sku: "SKU-1", qty: 2 }], amount: 1200, currency: "RUB" };
const PROBLEMS = "https://oncekey.dev/problems/";

if (url === "") {
  test(
    "live Oncekey server",
    { skip: inCI ? false : "ONCEKEY_URL is not set (set it and ONCEKEY_API_KEY to run against a server)" },
    () => assert.fail("CI is set but ONCEKEY_URL is not: the live tests must run in CI, not be skipped"),
  );
} else {
  describe(`live Oncekey server at ${url}`, () => {
    assert.notEqual(apiKey, "", "ONCEKEY_API_KEY must be set along with ONCEKEY_URL");
    const client = createClient({ baseUrl: url, apiKey });
    let created: Order | undefined;

    test("createOrder returns the created order", async () => {
      created = await client.createOrder(SEED);
      assert.ok(created.id);
      assert.equal(created.status, "created");
      assert.equal(created.amount, 1200);
      assert.equal(created.currency, "RUB");
      assert.deepEqual(created.items, SEED.items);
    });

    test("the same key sent twice is replayed with Idempotent-Replayed: true", async () => {
      const key = crypto.randomUUID();
      const send = () =>
        client.idempotent(
          (k) => client.api.POST("/orders", { params: { header: { "Idempotency-Key": k } }, body: SEED }),
          { key },
        );
      const first = await send();
      const second = await send();
      assert.equal(first.response.status, 201);
      assert.equal(first.response.headers.get("Idempotent-Replayed"), null);
      assert.equal(second.response.status, 201);
      assert.equal(second.response.headers.get("Idempotent-Replayed"), "true");
      assert.equal(second.response.headers.get("Idempotency-Key"), key);
      // A 2xx body is typed Order | Problem (202 is a 2xx); these are 201s.
      const [a, b] = [first.data as Order, second.data as Order];
      assert.ok(a.id);
      assert.equal(b.id, a.id);
      assert.deepEqual(b, a);
    });

    test("getOrder returns the same order", async () => {
      assert.ok(created, "createOrder test must run first");
      assert.deepEqual(await client.getOrder(created.id), created);
    });

    test("listOrders contains it", async () => {
      assert.ok(created, "createOrder test must run first");
      // Newest first, so it is on the first page unless the account is busy;
      // follow a few cursors to tolerate a shared server.
      let cursor: string | undefined;
      for (let page = 0; page < 10; page++) {
        const res = await client.listOrders({ limit: 100, cursor });
        if (res.items.some((o) => o.id === created!.id)) return;
        if (!res.next_cursor) break;
        cursor = res.next_cursor;
      }
      assert.fail(`order ${created.id} not found in listOrders`);
    });

    test("an invalid body throws OncekeyProblemError 400 validation-error", async () => {
      const invalid = { items: [], amount: 0, currency: "rub" } as NewOrder;
      await assert.rejects(client.createOrder(invalid), (err: unknown) => {
        assert.ok(err instanceof OncekeyProblemError, String(err));
        assert.equal(err.status, 400);
        assert.equal(err.problem.type, `${PROBLEMS}validation-error`);
        assert.equal(err.problem.status, 400);
        return true;
      });
    });

    test("the same key with a different body throws 409 idempotency-key-mismatch", async () => {
      const idempotencyKey = crypto.randomUUID();
      await client.createOrder(SEED, { idempotencyKey });
      await assert.rejects(
        client.createOrder({ ...SEED, amount: 1800 }, { idempotencyKey }),
        (err: unknown) => {
          assert.ok(err instanceof OncekeyProblemError, String(err));
          assert.equal(err.status, 409);
          assert.equal(err.problem.type, `${PROBLEMS}idempotency-key-mismatch`);
          return true;
        },
      );
    });

    test("an unknown order is a 404 not-found", async () => {
      await assert.rejects(client.getOrder("00000000-0000-7000-8000-000000000000"), (err: unknown) => {
        assert.ok(err instanceof OncekeyProblemError, String(err));
        assert.equal(err.status, 404);
        assert.equal(err.problem.type, `${PROBLEMS}not-found`);
        return true;
      });
    });
  });
}
