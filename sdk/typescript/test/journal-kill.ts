// The key journal across a crash, shared by test/journal-kill-*.test.ts (one
// file per kill point, so each stays well inside node --test's per-file
// timeout) and test/journal-lock.test.ts.
//
// A client process (./journal-child.ts) running createOrder under an intent
// with a file journal is killed with SIGKILL at one point where a key could
// be lost; then another process (this one, with the same journal file) runs
// the intent again. Against an idempotent server (same key → the same stored
// answer, an order per new key) every round must end with exactly one order,
// and the re-run's answer must be that order.
//
// Points: "append" (the entry is durable, nothing sent), "send" (the request
// reached the server, which holds its answer until the kill), "answer" (the
// answer arrived, the journal has not recorded it). ROUNDS rounds per point
// (JOURNAL_KILL_ROUNDS, default 100), BATCH at a time (each round has a
// journal of its own); the re-runs alternate between createOrder again and
// resume() then createOrder.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createClient, type Order } from "../dist/index.js";
import { openFileJournal } from "../dist/journal-file.js";

const ROUNDS = Number(process.env.JOURNAL_KILL_ROUNDS ?? 100);
const BATCH = 4;
const CHILD = fileURLToPath(new URL("./journal-child.js", import.meta.url));
export const dir = mkdtempSync(path.join(tmpdir(), "oncekey-journal-kill-"));
after(() => rmSync(dir, { recursive: true, force: true }));

/**
 * An idempotent POST /orders: a new key creates an order and stores its
 * answer, a known key gets the stored answer. Orders are counted per SKU
 * (one SKU per round). A SKU in `hold` gets no answer: the order exists,
 * the client never hears of it.
 */
export async function idempotentServer() {
  const stored = new Map<string, string>(); // key → the answer's body
  const keysBySku = new Map<string, Set<string>>(); // the keys that created an order
  const requests = new Map<string, string[]>(); // SKU → the key of every request
  const arrivals = new Map<string, () => void>();
  const hold = new Set<string>();
  const delayMs = { value: 0 };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const key = String(req.headers["idempotency-key"]);
      const body = JSON.parse(Buffer.concat(chunks).toString()) as { items: Array<{ sku: string }> };
      const sku = body.items[0]!.sku;
      requests.set(sku, [...(requests.get(sku) ?? []), key]);
      const replayed = stored.has(key);
      if (!replayed) {
        const order = { id: crypto.randomUUID(), status: "created", ...body, created_at: new Date().toISOString() };
        stored.set(key, JSON.stringify(order));
        keysBySku.set(sku, (keysBySku.get(sku) ?? new Set()).add(key));
      }
      arrivals.get(sku)?.();
      if (hold.has(sku)) return; // the answer is lost with the client
      const answer = () => {
        res.writeHead(201, {
          "Content-Type": "application/json",
          "Idempotency-TTL": "86400",
          ...(replayed ? { "Idempotent-Replayed": "true" } : {}),
        });
        res.end(stored.get(key));
      };
      if (delayMs.value > 0) setTimeout(answer, delayMs.value);
      else answer();
    });
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    stored,
    keysBySku,
    requests,
    hold,
    delayMs,
    /** Resolves when a request of this SKU has arrived (now or already). */
    arrived: (sku: string) =>
      requests.has(sku) ? Promise.resolve() : new Promise<void>((resolve) => arrivals.set(sku, resolve)),
  };
}

type Server = Awaited<ReturnType<typeof idempotentServer>>;

interface Printed {
  order: Order;
  outcomes?: Array<{ kind: string; key: string }>;
}

interface Run {
  child: ChildProcess;
  /** Resolves once the child has printed this line. */
  printed(line: string): Promise<void>;
  /** Resolves with the JSON the child printed once it exits 0. */
  result: Promise<Printed>;
}

// A failed round leaves its batch's other children waiting to be killed.
const running = new Set<ChildProcess>();
after(() => {
  for (const c of running) c.kill("SIGKILL");
});

export function child(env: Record<string, string>): Run {
  const c = spawn(process.execPath, [CHILD], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  running.add(c);
  c.on("exit", () => running.delete(c));
  let out = "";
  let err = "";
  const waiters: Array<[string, () => void]> = [];
  c.stdout!.on("data", (d: Buffer) => {
    out += d.toString();
    for (const [line, resolve] of waiters) if (out.split("\n").includes(line)) resolve();
  });
  c.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const result = new Promise<Printed>((resolve, reject) =>
    c.on("exit", (code, signal) => {
      const last = out.trim().split("\n").pop() ?? "";
      if (code === 0) resolve(JSON.parse(last));
      else reject(new Error(`child exited ${code ?? signal}: ${out}${err}`));
    }),
  );
  return {
    child: c,
    result,
    printed: (line) =>
      new Promise<void>((resolve, reject) => {
        if (out.split("\n").includes(line)) resolve();
        waiters.push([line, resolve]);
        c.on("exit", (code, signal) => reject(new Error(`child exited ${code ?? signal} before ${line}: ${out}${err}`)));
      }),
  };
}

export async function killed(run: Run): Promise<void> {
  const exited = new Promise<void>((resolve) => run.child.on("exit", () => resolve()));
  run.child.kill("SIGKILL");
  await exited;
  run.result.catch(() => {}); // it died, as intended
}

export type Point = "append" | "send" | "answer";

/** ROUNDS kills at `point`, each followed by a re-run in this process; reports the time taken. */
export function killRounds(point: Point): void {
  test(`killed at "${point}", then run again: one order per intent, ${ROUNDS} rounds, ${BATCH} at a time`, { timeout: 300_000 }, async (t) => {
    const server = await idempotentServer();
    const started = Date.now();
    for (let n = 0; n < ROUNDS; n += BATCH) {
      await Promise.all(Array.from({ length: Math.min(BATCH, ROUNDS - n) }, (_, i) => round(server, point, n + i)));
    }
    t.diagnostic(`${ROUNDS} rounds (${ROUNDS} processes killed) in ${Date.now() - started} ms`);
  });
}

async function round(server: Server, point: Point, n: number): Promise<void> {
  const sku = `${point}-${n}`;
  const journalFile = path.join(dir, `${sku}.journal`);
  const intent = `checkout ${sku}`;
  if (point === "send") server.hold.add(sku);
  const first = child({ ONCEKEY_URL: server.url, JOURNAL: journalFile, INTENT: intent, SKU: sku, KILL_AT: point === "send" ? "" : point });
  if (point === "send") await server.arrived(sku);
  else await first.printed(point === "append" ? "appended" : "answered");
  if (point === "append") assert.equal(server.requests.get(sku), undefined, `${sku}: killed before sending, yet sent`);
  await killed(first);
  server.hold.delete(sku);

  // The restart: another process (this one) with the same journal file.
  const journal = await openFileJournal(journalFile);
  const client = createClient({ baseUrl: server.url, apiKey: "ok_kill_test", retry: { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 20 }, journal });
  const mode = n % 2 === 0 ? "rerun" : "resume";
  const outcomes = mode === "resume" ? await client.resume() : undefined;
  const order = await client.createOrder({ items: [{ sku, qty: 1 }], amount: 1200, currency: "RUB" }, { intent });
  await journal.close();

  const keys = [...(server.keysBySku.get(sku) ?? [])];
  assert.equal(keys.length, 1, `${sku} (${mode}): ${keys.length} orders`);
  assert.deepEqual(order, JSON.parse(server.stored.get(keys[0]!)!), `${sku}: the re-run's answer is the first order`);
  // One request before the kill (none at "append"), one after: the
  // createOrder after resume() came from the journal.
  assert.deepEqual(server.requests.get(sku), point === "append" ? keys : [keys[0], keys[0]], `${sku} (${mode})`);
  if (outcomes) assert.deepEqual(outcomes.map((o) => [o.kind, o.entry.key]), [["answered", keys[0]]], sku);
}
