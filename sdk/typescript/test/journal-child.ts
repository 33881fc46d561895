// A client process for test/journal-kill.test.ts, which kills it with
// SIGKILL at a point of its choosing and runs it again. Not a test itself
// (not *.test.js), and its kill hooks live here, not in the shipped API.
//
// Env: ONCEKEY_URL (ONCEKEY_API_KEY, default ok_kill_test); JOURNAL (file); INTENT; SKU (names the round's order);
// LOCK (socket | pidfile); KILL_AT: "append" prints `appended` once the entry
// is durable and waits to be killed before anything is sent; "answer" prints
// `answered` once the answer arrived and waits to be killed before the
// journal records it. MODE: "rerun" calls createOrder under INTENT again;
// "resume" calls resume() first, then createOrder (which must not send).
// Prints one JSON line: { order, outcomes? }.
import { createClient, type Journal, type NewOrder } from "../dist/index.js";
import { openFileJournal } from "../dist/journal-file.js";

const env = (name: string) => process.env[name] ?? "";

/**
 * Says where it is, then waits for the SIGKILL; a minute without one (its
 * test failed or timed out) ends it, so no child outlives its test.
 */
function hang(point: string): Promise<never> {
  process.stdout.write(`${point}\n`);
  setTimeout(() => process.exit(3), 60_000);
  return new Promise<never>(() => {});
}

const inner = await openFileJournal(env("JOURNAL"), { lock: env("LOCK") === "pidfile" ? "pidfile" : "socket" });
const journal: Journal = {
  append: async (e) => {
    await inner.append(e);
    if (env("KILL_AT") === "append") await hang("appended");
  },
  record: async (key, answer) => {
    if (env("KILL_AT") === "answer") await hang("answered");
    await inner.record(key, answer);
  },
  pending: () => inner.pending(),
  byIntent: (intent) => inner.byIntent(intent),
  setRetention: (origin, ms) => inner.setRetention(origin, ms),
  retention: (origin) => inner.retention(origin),
  forget: (key) => inner.forget(key),
  compact: (now) => inner.compact(now),
};

const client = createClient({
  baseUrl: env("ONCEKEY_URL"),
  apiKey: process.env.ONCEKEY_API_KEY || "ok_kill_test",
  retry: { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 20 },
  journal,
});
const body: NewOrder = { items: [{ sku: env("SKU"), qty: 1 }], amount: 1200, currency: "RUB" };
const outcomes = env("MODE") === "resume" ? await client.resume() : undefined;
const order = await client.createOrder(body, { intent: env("INTENT") });
await inner.close();
process.stdout.write(
  `${JSON.stringify({ order, outcomes: outcomes?.map((o) => ({ kind: o.kind, key: o.entry.key })) })}\n`,
  () => process.exit(0),
);
