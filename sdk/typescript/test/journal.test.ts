// The key journal in one process: intents reuse their key (or their stored
// answer), resume reports each outcome, an expired entry is never sent, and
// the file journal survives a write torn at any byte.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import fs, { mkdtempSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import {
  createClient,
  DEFAULT_KEY_RETENTION_MS,
  idempotent,
  IntentExpiredError,
  IntentMismatchError,
  MemoryJournal,
  pending,
  resume,
  type Journal,
  type JournalEntry,
  type NewOrder,
  type OncekeyClient,
} from "../dist/index.js";
import { openFileJournal } from "../dist/journal-file.js";
import { isProblem } from "./problems.js";
import { drop, problem, reply, scripted } from "./scripted-server.js";

const SEED: NewOrder = { items: [{ sku: "SKU-1", qty: 2 }], amount: 1200, currency: "RUB" };
const ORDER = { id: "01a236fb-6340-7767-a7b8-fd2b954bc880", status: "created", ...SEED, created_at: "2026-12-02T13:39:34.336485Z" };
const FAST = { maxAttempts: 3, baseDelayMs: 1, maxDelayMs: 5 };
const HOUR = 60 * 60 * 1000;

function scratch(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "oncekey-journal-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Both journals, each test run against each: the file one must behave as the memory one. */
const JOURNALS: Array<[string, () => Promise<Journal & { close?: () => Promise<void> }>]> = [
  ["memory", async () => new MemoryJournal()],
  ["file", () => openFileJournal(path.join(scratch(), "keys.journal"))],
];

/** A pending entry as a crashed process would have left it. */
function leftOver(over: Partial<JournalEntry> = {}): JournalEntry {
  return {
    key: crypto.randomUUID(),
    operation: "POST /orders",
    bodyHash: "0".repeat(64),
    createdAt: Date.now(),
    request: { method: "POST", path: "/orders", body: JSON.stringify(SEED), contentType: "application/json" },
    ...over,
  };
}

for (const [name, open] of JOURNALS) {
  describe(`intents (${name} journal)`, () => {
    test("createOrder under an intent: the re-run returns the stored order without sending", async () => {
      const journal = await open();
      const { url, seen } = await scripted(reply(201, ORDER, { Location: `/orders/${ORDER.id}` }));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      assert.deepEqual(await c.createOrder(SEED, { intent: "checkout cart 123" }), ORDER);
      assert.deepEqual(await c.createOrder(SEED, { intent: "checkout cart 123" }), ORDER);
      assert.equal(seen.length, 1, "the re-run must come from the journal");
      assert.deepEqual(await journal.pending(), []);
      await journal.close?.();
    });

    test("an unanswered intent is sent again with its journaled key", async () => {
      const journal = await open();
      const { url, seen } = await scripted(drop, drop, drop, reply(201, ORDER));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      await assert.rejects(c.createOrder(SEED, { intent: "cart 7" }), TypeError);
      const [left] = await journal.pending();
      assert.equal(left?.intent, "cart 7");
      assert.deepEqual(await c.createOrder(SEED, { intent: "cart 7" }), ORDER);
      assert.equal(seen.length, 4);
      for (const s of seen) assert.equal(s.key, left!.key, "every attempt, before and after, carries the journaled key");
      await journal.close?.();
    });

    test("a stored 4xx is returned again, as the server would", async () => {
      const journal = await open();
      const { url, seen } = await scripted(problem(422, "unknown-currency"));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      await assert.rejects(c.createOrder(SEED, { intent: "i" }), isProblem(422, "unknown-currency"));
      await assert.rejects(c.createOrder(SEED, { intent: "i" }), isProblem(422, "unknown-currency"));
      assert.equal(seen.length, 1);
      await journal.close?.();
    });

    test("an intent re-run with another body is refused before sending", async () => {
      const journal = await open();
      const { url, seen } = await scripted(reply(201, ORDER));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      await c.createOrder(SEED, { intent: "i" });
      await assert.rejects(c.createOrder({ ...SEED, amount: 1 }, { intent: "i" }), IntentMismatchError);
      assert.equal(seen.length, 1);
      await journal.close?.();
    });

    test("idempotent() with a journal: the re-run's Response is rebuilt from the journal", async () => {
      const journal = await open();
      const { url, seen } = await scripted(reply(200, { id: "ch_1" }, { "Idempotency-TTL": "3600" }));
      const charge = (key: string) =>
        fetch(`${url}/v1/charges`, { method: "POST", headers: { "Idempotency-Key": key }, body: "amount=1200" });
      const opts = { ...FAST, journal, intent: "charge 1", origin: url, request: { method: "POST", path: "/v1/charges", body: "amount=1200" } };
      const first = await idempotent(charge, opts);
      assert.deepEqual(await first.json(), { id: "ch_1" }, "the caller still reads the body the journal read");
      const again = await idempotent(charge, opts);
      assert.equal(again.status, 200);
      assert.equal(again.headers.get("Content-Type"), "application/json");
      assert.deepEqual(await again.json(), { id: "ch_1" });
      assert.equal(seen.length, 1);
      assert.equal(await journal.retention(url), 3_600_000, "Idempotency-TTL is remembered per origin");
      await journal.close?.();
    });

    test("an answer too big to store whole is fetched again with its key, not replayed cut", async () => {
      const journal = await open();
      const big = { ...ORDER, items: Array.from({ length: 3000 }, (_, n) => ({ sku: `SKU-${n}`, qty: 1 })) };
      const { url, seen } = await scripted(reply(201, big));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      assert.deepEqual(await c.createOrder(SEED, { intent: "big" }), big);
      assert.equal((await journal.byIntent("big"))?.answer?.truncated, true);
      assert.deepEqual(await c.createOrder(SEED, { intent: "big" }), big);
      assert.equal(seen.length, 2);
      assert.equal(seen[1]!.key, seen[0]!.key);
      await journal.close?.();
    });

    test("an answer too big to store whole, past its retention, is not fetched again: the key may be forgotten", async () => {
      const journal = await open();
      const { url, seen } = await scripted(reply(201, ORDER));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      const old = leftOver({ origin: url, intent: "big", bodyHash: await hashOf(JSON.stringify(SEED)), createdAt: Date.now() - 2 * HOUR });
      await journal.append(old);
      await journal.record(old.key, { status: 201, headers: {}, body: "{", truncated: true, answeredAt: Date.now() - HOUR / 2, retentionMs: HOUR });
      await assert.rejects(c.createOrder(SEED, { intent: "big" }), IntentExpiredError);
      assert.equal(seen.length, 0);
      await journal.close?.();
    });

    test("two calls of one intent at once in one process: one request", async () => {
      const journal = await open();
      const { url, seen } = await scripted(reply(201, ORDER));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      const both = await Promise.all([c.createOrder(SEED, { intent: "i" }), c.createOrder(SEED, { intent: "i" })]);
      assert.deepEqual(both, [ORDER, ORDER]);
      assert.equal(seen.length, 1);
      await journal.close?.();
    });
  });

  describe(`resume and outcomes (${name} journal)`, () => {
    test("each kind of answer is its own outcome; only lasting answers are recorded", async () => {
      const journal = await open();
      const { url, seen } = await scripted(
        reply(201, ORDER),
        problem(422, "unknown-currency"),
        problem(409, "outcome-unknown"),
        problem(202, "request-in-progress", { "Retry-After": "0" }),
        drop,
      );
      const c = createClient({ baseUrl: url, apiKey: "k", retry: { ...FAST, maxAttempts: 1 }, journal });
      const entries = [1, 2, 3, 4, 5].map((n) => leftOver({ origin: url, intent: `i${n}`, createdAt: Date.now() - 5 + n }));
      for (const e of entries) await journal.append(e);
      const outcomes = await c.resume();
      assert.deepEqual(
        outcomes.map((o) => [o.kind, o.entry.key]),
        [
          ["answered", entries[0]!.key],
          ["refused", entries[1]!.key],
          ["unknown", entries[2]!.key],
          ["inProgress", entries[3]!.key],
          ["failed", entries[4]!.key],
        ],
      );
      const [answered, refused] = outcomes;
      assert.ok(answered?.kind === "answered" && refused?.kind === "refused");
      assert.deepEqual(JSON.parse(answered.body), ORDER);
      assert.equal(refused.status, 422);
      assert.deepEqual(seen.map((s) => [s.key, s.method, s.url, s.authorization, s.contentType, s.body]), entries.map((e) => [e.key, "POST", "/orders", "Bearer k", "application/json", JSON.stringify(SEED)]));
      assert.deepEqual((await journal.pending()).map((e) => e.intent), ["i3", "i4", "i5"], "unknown, in progress and failed stay pending");
      await journal.close?.();
    });

    test("an expired entry is never sent: the server gets zero requests", async () => {
      const journal = await open();
      const { url, seen } = await scripted(reply(201, ORDER));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: FAST, journal });
      const old = leftOver({ origin: url, intent: "old cart", bodyHash: await hashOf(JSON.stringify(SEED)), createdAt: Date.now() - DEFAULT_KEY_RETENTION_MS - 1 });
      await journal.append(old);
      await assert.rejects(c.createOrder(SEED, { intent: "old cart" }), (err) => err instanceof IntentExpiredError && err.entry.key === old.key);
      const outcomes = await c.resume();
      assert.deepEqual(outcomes.map((o) => o.kind), ["expired"]);
      assert.equal(seen.length, 0, "an expired key must never reach the server");
      assert.equal((await pending(journal))[0]?.expired, true, "it stays listed until the caller forgets it");
      await journal.forget(old.key);
      assert.deepEqual(await journal.pending(), []);
      await journal.close?.();
    });

    test("an unanswered entry's retention is the origin's advertised Idempotency-TTL, not the default", async () => {
      const journal = await open();
      const { url, seen } = await scripted(reply(201, ORDER, { "Idempotency-TTL": "60" }));
      const sent: string[] = [];
      const send = (e: JournalEntry) => {
        sent.push(e.key);
        return fetch(url + e.request!.path, { method: "POST", headers: { "Idempotency-Key": e.key }, body: e.request!.body! });
      };
      await journal.append(leftOver({ origin: url }));
      assert.deepEqual((await resume(journal, send, FAST)).map((o) => o.kind), ["answered"]);
      assert.equal(await journal.retention(url), 60_000);
      // Two minutes old: well inside the 24 h default, past the server's 60 s.
      await journal.append(leftOver({ origin: url, createdAt: Date.now() - 2 * 60_000 }));
      assert.deepEqual((await resume(journal, send, FAST)).map((o) => o.kind), ["expired"]);
      assert.equal(seen.length, 1);
      assert.equal(sent.length, 1);
      await journal.close?.();
    });

    test("compaction drops answered entries past their retention and keeps the rest", async () => {
      const journal = await open();
      const now = Date.now();
      const answer = { status: 201, headers: {}, body: "{}", retentionMs: HOUR };
      const gone = leftOver({ intent: "gone" });
      const kept = leftOver({ intent: "kept" });
      const open_ = leftOver({ intent: "open", createdAt: now - 10 * HOUR });
      for (const e of [gone, kept, open_]) await journal.append(e);
      await journal.record(gone.key, { ...answer, answeredAt: now - 2 * HOUR });
      await journal.record(kept.key, { ...answer, answeredAt: now - HOUR / 2 });
      await journal.compact(now);
      assert.equal(await journal.byIntent("gone"), undefined);
      assert.equal((await journal.byIntent("kept"))?.answer?.status, 201);
      assert.equal((await journal.byIntent("open"))?.key, open_.key, "an unanswered entry is never compacted away");
      await journal.close?.();
    });
  });
}

async function hashOf(text: string): Promise<string> {
  const d = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Buffer.from(d).toString("hex");
}

describe("what the client's methods journal is what resume sends again", () => {
  const calls = [
    ["createOrder", (c: OncekeyClient) => c.createOrder(SEED, { intent: "x" })],
    ["updateOrder", (c: OncekeyClient) => c.updateOrder("o/1", { amount: 1800 }, { intent: "x" })],
    ["cancelOrder", (c: OncekeyClient) => c.cancelOrder("o/1", { intent: "x" })],
    ["createRefund", (c: OncekeyClient) => c.createRefund("p_1", { amount: 300, reason: "returned" }, { intent: "x" })],
    ["createPayment", (c: OncekeyClient) => c.createPayment({ order_id: "o_1", amount: 1, currency: "RUB" }, { intent: "x" })],
    ["createBonusCredit", (c: OncekeyClient) => c.createBonusCredit({ amount: 5, reason: "r" }, { intent: "x" })],
    ["createBonusDebit", (c: OncekeyClient) => c.createBonusDebit({ amount: 5, reason: "r" }, { intent: "x" })],
  ] as const;
  for (const [name, call] of calls) {
    test(`${name}: the resent request is the first one, byte for byte, with its key`, async () => {
      const journal = new MemoryJournal();
      const { url, seen } = await scripted(drop, reply(200, ORDER));
      const c = createClient({ baseUrl: url, apiKey: "k", retry: { ...FAST, maxAttempts: 1 }, journal });
      await assert.rejects(call(c), TypeError);
      assert.deepEqual((await c.resume()).map((o) => o.kind), ["answered"]);
      const [first, again] = seen;
      assert.ok(first && again);
      assert.deepEqual(
        [again.method, again.url, again.key, again.authorization, again.contentType, again.body],
        [first.method, first.url, first.key, first.authorization, first.contentType, first.body],
      );
    });
  }
});

describe("the file journal on disk", () => {
  /** A journal file of a few records of every kind, and what each prefix of it must still hold. */
  async function written(file: string) {
    const j = await openFileJournal(file);
    const a = leftOver({ intent: "a", origin: "http://x" });
    const b = leftOver({ intent: "b — ünïcode ✓", origin: "http://x" });
    await j.append(a);
    await j.setRetention("http://x", 60_000);
    await j.append(b);
    await j.record(a.key, { status: 201, headers: { "content-type": "application/json" }, body: JSON.stringify(ORDER), answeredAt: Date.now(), retentionMs: HOUR });
    await j.close();
    return { a, b };
  }

  test("cut at every byte offset: opens without error, keeps every record before the cut, warns of the torn one", async () => {
    const dir = scratch();
    const full = path.join(dir, "full.journal");
    const { a, b } = await written(full);
    const bytes = readFileSync(full);
    const ends: number[] = []; // the offset just past each record's newline
    for (let i = 0; i < bytes.length; i++) if (bytes[i] === 0x0a) ends.push(i + 1);
    assert.equal(ends.length, 4);
    const cut = path.join(dir, "cut.journal");
    for (let offset = 0; offset <= bytes.length; offset++) {
      writeFileSync(cut, bytes.subarray(0, offset));
      const warnings: string[] = [];
      const j = await openFileJournal(cut, { onWarning: (m) => warnings.push(m) });
      // Whole records before the cut (a record missing only its newline is whole too).
      const whole = ends.filter((end) => end - 1 <= offset).length;
      const torn = offset > 0 && !ends.includes(offset) && !ends.includes(offset + 1);
      assert.equal(warnings.length, torn ? 1 : 0, `offset ${offset}: ${warnings.join("; ")}`);
      assert.equal((await j.byIntent("a"))?.key, whole >= 1 ? a.key : undefined, `offset ${offset}`);
      assert.equal(await j.retention("http://x"), whole >= 2 ? 60_000 : undefined, `offset ${offset}`);
      assert.equal((await j.byIntent("b — ünïcode ✓"))?.key, whole >= 3 ? b.key : undefined, `offset ${offset}`);
      assert.equal((await j.byIntent("a"))?.answer?.status, whole >= 4 ? 201 : undefined, `offset ${offset}`);
      // The torn tail is cut on open: what is appended next reads back.
      const c = leftOver({ intent: "c" });
      await j.append(c);
      await j.close();
      const again = await openFileJournal(cut, { onWarning: (m) => assert.fail(`offset ${offset}: after repair: ${m}`) });
      assert.equal((await again.byIntent("c"))?.key, c.key, `offset ${offset}`);
      await again.close();
    }
  });

  test("a corrupt record in the middle is skipped with a warning; the records after it are kept", async () => {
    const file = path.join(scratch(), "k.journal");
    const { b } = await written(file);
    const bytes = readFileSync(file);
    bytes[20] = bytes[20] === 0x41 ? 0x42 : 0x41; // inside the first record's JSON
    writeFileSync(file, bytes);
    const warnings: string[] = [];
    const j = await openFileJournal(file, { onWarning: (m) => warnings.push(m) });
    assert.equal(warnings.length, 1, warnings.join("; ")); // its answer, with no entry left, is dropped quietly
    assert.match(warnings[0]!, /corrupt journal record at byte 0/);
    assert.equal((await j.byIntent("b — ünïcode ✓"))?.key, b.key);
    await j.close();
  });

  test("opening compacts: answered entries past retention leave the file, written anew", async () => {
    const file = path.join(scratch(), "k.journal");
    const j = await openFileJournal(file);
    for (let n = 0; n < 20; n++) {
      const e = leftOver({ intent: `done ${n}` });
      await j.append(e);
      await j.record(e.key, { status: 201, headers: {}, body: "x".repeat(500), answeredAt: Date.now() - 2 * HOUR, retentionMs: HOUR });
    }
    await j.append(leftOver({ intent: "pending" }));
    await j.setRetention("http://x", 1000);
    await j.close();
    const before = statSync(file).size;
    const later = await openFileJournal(file);
    assert.ok(statSync(file).size < before / 10, `${statSync(file).size} bytes after compaction, ${before} before`);
    assert.deepEqual((await later.pending()).map((e) => e.intent), ["pending"]);
    assert.equal(await later.byIntent("done 0"), undefined);
    assert.equal(await later.retention("http://x"), 1000);
    await later.close();
  });

  test("a journal that runs for long compacts itself: at 1,024 records, answered entries past retention go", async () => {
    const file = path.join(scratch(), "k.journal");
    let now = Date.now();
    const j = await openFileJournal(file, { now: () => now });
    await j.append(leftOver({ intent: "pending" }));
    for (let n = 0; n < 600; n++) {
      const e = leftOver({ intent: `done ${n}`, createdAt: now });
      await j.append(e);
      await j.record(e.key, { status: 201, headers: {}, body: "x", answeredAt: now, retentionMs: HOUR });
      now += 10_000; // 600 operations over 100 minutes: the first ones are past the hour
    }
    const lines = readFileSync(file, "utf8").split("\n").length - 1;
    assert.ok(lines < 1000, `${lines} records in the file after 1,201 writes`);
    assert.equal(await j.byIntent("done 0"), undefined, "answered past its retention: gone");
    assert.equal((await j.byIntent("done 599"))?.answer?.status, 201, "within it: kept");
    await j.append(leftOver({ intent: "after" }));
    await j.close();
    const again = await openFileJournal(file, { now: () => now, onWarning: (m) => assert.fail(m) });
    assert.deepEqual((await again.pending()).map((e) => e.intent), ["pending", "after"], "the appends after it are in the new file");
    await again.close();
  });

  // A SIGKILL cannot lose what write() gave the kernel, so the kill tests
  // cannot see a missing fsync; a power cut could. This watches for it.
  test("every write is fsync'd before it resolves; compaction fsyncs the new file and its directory", async (t) => {
    const file = path.join(scratch(), "k.journal");
    const j = await openFileJournal(file);
    const synced: string[] = [];
    const fsyncSync = fs.fsyncSync;
    t.after(() => void (fs.fsyncSync = fsyncSync));
    fs.fsyncSync = (fd: number) => {
      const target = fs.readlinkSync(`/proc/self/fd/${fd}`);
      synced.push(target === file ? `${statSync(file).size}` : target === path.dirname(file) ? "dir" : "other");
      fsyncSync(fd);
    };
    const e = leftOver({ intent: "x", origin: "http://x" });
    for (const write of [
      () => j.append(e),
      () => j.setRetention("http://x", 60_000),
      () => j.record(e.key, { status: 201, headers: {}, body: "{}", answeredAt: Date.now(), retentionMs: HOUR }),
      () => j.forget(e.key),
    ]) {
      synced.length = 0;
      await write();
      assert.deepEqual(synced, [`${statSync(file).size}`], "one fsync of the journal, after its write");
    }
    synced.length = 0;
    await j.compact();
    assert.deepEqual(synced, ["other", "dir"], "the new file before its rename, then the directory");
    await j.close();
  });

  test("the journal, and the file compaction writes, are its owner's only: they hold request and answer bodies", async () => {
    const file = path.join(scratch(), "k.journal");
    const j = await openFileJournal(file);
    assert.equal(statSync(file).mode & 0o777, 0o600);
    await j.compact();
    assert.equal(statSync(file).mode & 0o777, 0o600);
    await j.close();
  });

  test("a file truncated to nothing opens empty", async () => {
    const file = path.join(scratch(), "k.journal");
    await written(file);
    truncateSync(file, 0);
    const j = await openFileJournal(file);
    assert.deepEqual(await j.pending(), []);
    await j.close();
  });
});
