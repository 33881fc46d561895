// The file journal's lock, both kinds, across processes: see ./journal-kill.ts.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, utimesSync, writeFileSync } from "node:fs";
import path from "node:path";
import { openFileJournal } from "../dist/journal-file.js";
import { child, dir, idempotentServer, killed } from "./journal-kill.js";

describe("the journal's lock", async () => {
  const server = await idempotentServer();

  for (const lock of ["socket", "pidfile"] as const) {
    test(`${lock}: two processes running the same intent at once make one order`, async () => {
      server.delayMs.value = 200; // the first holds its request open while the second starts
      try {
        for (let n = 0; n < 5; n++) {
          const sku = `both-${lock}-${n}`;
          const env = { ONCEKEY_URL: server.url, JOURNAL: path.join(dir, `${sku}.journal`), INTENT: sku, SKU: sku, LOCK: lock };
          const [a, b] = await Promise.all([child(env).result, child(env).result]);
          assert.equal(server.keysBySku.get(sku)?.size, 1, `${sku}: orders`);
          assert.deepEqual(a.order, b.order);
          assert.equal(server.requests.get(sku)?.length, 1, `${sku}: the second must find the answer in the journal`);
        }
      } finally {
        server.delayMs.value = 0;
      }
    });

    test(`${lock}: a holder killed with SIGKILL leaves no stale lock: the next takes it at once`, async () => {
      const sku = `held-${lock}`;
      const file = path.join(dir, `${sku}.journal`);
      const holder = child({ ONCEKEY_URL: server.url, JOURNAL: file, INTENT: sku, SKU: sku, LOCK: lock, KILL_AT: "append" });
      await holder.printed("appended");
      await assert.rejects(openFileJournal(file, { lock, lockTimeoutMs: 100 }), /held by another process/);
      await killed(holder);
      const started = Date.now();
      const next = await openFileJournal(file, { lock, lockTimeoutMs: 1_000 });
      const waited = Date.now() - started;
      assert.ok(waited < 1_000, `took ${waited} ms`);
      assert.equal((await next.pending())[0]?.intent, sku);
      await next.close();
    });
  }

  test("pidfile: a lock file left empty (its creator died before writing its pid) is taken over after a second", async () => {
    const file = path.join(dir, "empty-lock.journal");
    writeFileSync(`${file}.lock`, "");
    const old = new Date(Date.now() - 5_000);
    utimesSync(`${file}.lock`, old, old);
    const j = await openFileJournal(file, { lock: "pidfile", lockTimeoutMs: 1_000 });
    assert.equal(readFileSync(`${file}.lock`, "utf8"), `${process.pid}\n`);
    await j.close();
    assert.equal(existsSync(`${file}.lock`), false, "closing removes the lock file");
  });
});
