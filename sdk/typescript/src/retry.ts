/**
 * Idempotent retries: the one piece of client logic Oncekey needs.
 *
 * The server makes a POST exactly-once *per Idempotency-Key*, so the client's
 * whole job is to name each logical operation once and to send that same name
 * on every retry of it. A fresh key per attempt would turn a timeout into a
 * duplicate order; a key reused for a different operation would get a 409.
 */
import {
  advertisedRetentionMs,
  answerOf,
  DEFAULT_KEY_RETENTION_MS,
  expiresAt,
  IntentExpiredError,
  IntentMismatchError,
  MAX_BODY_CHARS,
  pending,
  responseOf as responseFromAnswer,
  sha256Hex,
  type Journal,
  type JournalEntry,
  type JournalRequest,
  type Outcome,
} from "./journal.js";

/** How hard to retry. Every field is optional where it is accepted. */
export interface RetryOptions {
  /** Total attempts including the first; at least 1. Default 5. */
  maxAttempts: number;
  /** Backoff scale: attempt n waits up to baseDelayMs * 2^(n-1). Default 100. */
  baseDelayMs: number;
  /** Upper bound on any single wait, Retry-After included. Default 5000. */
  maxDelayMs: number;
}

export const DEFAULT_RETRY: Readonly<RetryOptions> = Object.freeze({
  maxAttempts: 5,
  baseDelayMs: 100,
  maxDelayMs: 5_000,
});

/**
 * What an attempt may return: a fetch Response, or anything carrying one
 * (such as an openapi-fetch result `{ data, error, response }`).
 */
export type HasResponse = Response | { response: Response };

/**
 * Whether a status is worth another attempt with the same key.
 *
 * - 5xx: the server rolled the operation back and stored nothing (503 when a
 *   dependency is down), so the retry runs it.
 * - 202: another request with this key is still running; the retry gets its
 *   stored response once it finishes. (The 202 of a long operation, which
 *   carries the accepted resource, is not retried: `isRetryable` tells the
 *   two apart by the response's Content-Type.)
 * - Everything else is final. 4xx in particular means *this request* is wrong
 *   (or, for 409/422, the key is already bound to an outcome): sending it
 *   again unchanged cannot help.
 */
export function isRetryableStatus(status: number): boolean {
  return status === 202 || (status >= 500 && status <= 599);
}

/**
 * Whether a response is a 202 `request-in-progress` problem: another request
 * with this key is still running. The 202 of a long operation (a refund) is
 * not: its `application/json` body is the accepted, pending resource, the
 * operation's answer, polled afterwards with a GET.
 */
export function isInProgress(res: Response): boolean {
  if (res.status !== 202) return false;
  const mediaType = (res.headers.get("Content-Type") ?? "").split(";")[0]!.trim().toLowerCase();
  return mediaType !== "application/json";
}

/**
 * Whether a response is worth another attempt with the same key: a retryable
 * status (see isRetryableStatus), a 202 only while it is in progress (see
 * isInProgress).
 */
export function isRetryable(res: Response): boolean {
  return res.status === 202 ? isInProgress(res) : isRetryableStatus(res.status);
}

/**
 * The wait before attempt `attempt + 1`, after `attempt` attempts failed.
 *
 * A server's Retry-After (whole seconds) is honoured as given, because the
 * server knows when it expects to be able to answer; otherwise "full jitter"
 * (a uniform random wait in [0, min(max, base * 2^(attempt-1)))) spreads out
 * clients that failed together so they do not retry in lockstep. Either way
 * the wait is capped by maxDelayMs.
 */
export function retryDelayMs(
  attempt: number,
  opts: RetryOptions,
  retryAfter?: string | null,
  random: () => number = Math.random,
): number {
  if (retryAfter != null && /^\s*\d+\s*$/.test(retryAfter)) {
    return Math.min(Number(retryAfter) * 1000, opts.maxDelayMs);
  }
  const ceiling = Math.min(opts.maxDelayMs, opts.baseDelayMs * 2 ** (attempt - 1));
  return Math.floor(random() * ceiling);
}

/**
 * Runs `attempt` until it gives a final answer or attempts run out.
 *
 * Retried: a thrown error (fetch throws on network failures: refused, reset,
 * dropped mid-response — the request may or may not have reached the server,
 * which is exactly the case keys exist for) and a retryable response (see
 * isRetryable). Not retried: an AbortError, which means the caller gave
 * up. When attempts run out, the last response is returned (so its problem
 * can be reported) or the last error rethrown.
 *
 * On its own this is safe only for operations that are idempotent by nature
 * (GETs); for POSTs use `idempotent`, which adds the key.
 */
export async function withRetry<R extends HasResponse>(
  attempt: (n: number) => Promise<R>,
  options: Partial<RetryOptions> = {},
): Promise<R> {
  const opts: RetryOptions = { ...DEFAULT_RETRY, ...options };
  const maxAttempts = Math.max(1, Math.floor(opts.maxAttempts));
  for (let n = 1; ; n++) {
    let result: R;
    try {
      result = await attempt(n);
    } catch (err) {
      if (n >= maxAttempts || isAbort(err)) throw err;
      await sleep(retryDelayMs(n, opts));
      continue;
    }
    const res = responseOf(result);
    if (n >= maxAttempts || !isRetryable(res)) return result;
    await discardBody(res);
    await sleep(retryDelayMs(n, opts, res.headers.get("Retry-After")));
  }
}

/** Options for `idempotent`: retry tuning, an optional fixed key, an optional journal. */
export interface IdempotentOptions extends Partial<RetryOptions> {
  /**
   * The operation's Idempotency-Key. Default: a fresh crypto.randomUUID().
   * Pass your own when the operation must survive a restart of this process
   * (persist the key with the intent, e.g. next to the cart, before the first
   * attempt), since a new process would otherwise mint a new key. A journal
   * (below) does exactly that for you.
   */
  key?: string;
}

/**
 * `idempotent`'s options with a key journal: the key is written to `journal`
 * before the first attempt and the final answer after the last, so a re-run
 * of the same `intent` after a crash reuses the key (or returns the stored
 * answer without sending). See the README's "Key journal".
 */
export interface JournaledOptions extends IdempotentOptions {
  journal: Journal;
  /**
   * The caller's name for this one logical operation, unique per operation
   * and stable across restarts ("checkout cart 123"). A re-run with the same
   * intent reuses the journaled key. Without one the entry is journaled
   * for `resume` only.
   */
  intent?: string;
  /**
   * The request the operation sends: its method and path name the
   * operation, its body is hashed (a re-run of the intent with another body
   * is an IntentMismatchError), and it is kept (≤ 64 KiB) so `resume` can
   * send it again.
   */
  request?: JournalRequest;
  /** The server's origin ("https://api.example.com"), whose `Idempotency-TTL` is remembered. */
  origin?: string;
  /** An unanswered entry's retention when the origin advertised none. Default 24 h. */
  keyRetentionMs?: number;
}

/**
 * Runs one logical unsafe operation exactly once: picks ONE Idempotency-Key
 * and passes it to every attempt, retrying as `withRetry` does. The operation
 * must send `key` as its Idempotency-Key header and the same request every
 * time (the server answers 409 to the same key with a different request).
 *
 * With `journal`, the operation must return a fetch Response: a re-run of an
 * answered intent gets the stored answer rebuilt as one, without sending.
 *
 * @example
 *   const { data, response } = await idempotent((key) =>
 *     api.POST("/orders", { params: { header: { "Idempotency-Key": key } }, body }));
 */
export function idempotent(
  operation: (key: string, attempt: number) => Promise<Response>,
  options: JournaledOptions,
): Promise<Response>;
export function idempotent<R extends HasResponse>(
  operation: (key: string, attempt: number) => Promise<R>,
  options?: IdempotentOptions,
): Promise<R>;
export function idempotent<R extends HasResponse>(
  operation: (key: string, attempt: number) => Promise<R>,
  options: IdempotentOptions | JournaledOptions = {},
): Promise<R> {
  if ("journal" in options && options.journal) {
    return journaled(operation, options, bodyText, async (res) => res as R);
  }
  const { key = crypto.randomUUID(), ...retry } = options;
  return withRetry((n) => operation(key, n), retry);
}

// Intents running in this process, per journal: a second call with the same
// intent waits for the first, then finds its entry. (Other processes are kept
// out by the file journal's lock.)
const running = new WeakMap<Journal, Map<string, Promise<unknown>>>();

async function oneAtATime<T>(journal: Journal, intent: string | undefined, fn: () => Promise<T>): Promise<T> {
  if (intent === undefined) return fn();
  let intents = running.get(journal);
  if (!intents) running.set(journal, (intents = new Map()));
  const run = (intents.get(intent) ?? Promise.resolve()).then(fn, fn);
  const tail = run.catch(() => {});
  intents.set(intent, tail);
  try {
    return await run;
  } finally {
    if (intents.get(intent) === tail) intents.delete(intent);
  }
}

/**
 * The journaled run behind `idempotent` and the client's unsafe methods:
 * `read` gives the body text of a result, `revive` turns a stored answer
 * back into one. Exported for the client, not from the package.
 */
export async function journaled<R extends HasResponse>(
  operation: (key: string, attempt: number) => Promise<R>,
  options: JournaledOptions,
  read: (result: R) => Promise<string>,
  revive: (res: Response) => Promise<R>,
): Promise<R> {
  const { journal, intent, request, origin, keyRetentionMs = DEFAULT_KEY_RETENTION_MS, key, ...retry } = options;
  const label = request ? `${request.method.toUpperCase()} ${request.path}` : "request";
  const bodyHash = await sha256Hex(request?.body ?? "");
  return oneAtATime(journal, intent, async () => {
    let entry = intent === undefined ? undefined : await journal.byIntent(intent);
    if (entry) {
      if (entry.operation !== label || entry.bodyHash !== bodyHash) throw new IntentMismatchError(entry);
      // A body cut at MAX_BODY_CHARS cannot be replayed from here: the
      // server replays it whole to the same key while it remembers the key.
      if (entry.answer && !entry.answer.truncated) return revive(responseFromAnswer(entry.answer));
      // Counted from the append, before the first send: never later than the server forgets the key.
      const at = entry.answer ? entry.createdAt + entry.answer.retentionMs : await expiresAt(journal, entry, keyRetentionMs);
      if (at < Date.now()) throw new IntentExpiredError(entry, at);
    } else {
      entry = { key: key ?? crypto.randomUUID(), operation: label, bodyHash, createdAt: Date.now() };
      if (intent !== undefined) entry.intent = intent;
      if (origin !== undefined) entry.origin = origin;
      if (request && (request.body ?? "").length <= MAX_BODY_CHARS) entry.request = request;
      // Durable before anything is sent: a crash from here on finds the key.
      await journal.append(entry);
    }
    const sent = entry;
    const result = await withRetry((n) => operation(sent.key, n), retry);
    await settle(journal, sent, responseOf(result), await read(result), keyRetentionMs);
    return result;
  });
}

/**
 * Classifies a final response of a journaled entry and records it when it
 * is the key's lasting answer. Not recorded, so the entry stays pending for
 * `resume`: a 5xx (nothing stored server-side), a 202 in progress, and a 409
 * outcome-unknown (an operator may settle it later).
 */
async function settle(
  journal: Journal,
  entry: JournalEntry,
  res: Response,
  body: string,
  keyRetentionMs: number,
): Promise<Outcome> {
  const advertised = advertisedRetentionMs(res);
  if (advertised !== undefined && entry.origin !== undefined) await journal.setRetention(entry.origin, advertised);
  const response = rebuilt(res, body);
  if (isInProgress(res)) return { kind: "inProgress", entry, response };
  if (res.status >= 500) return { kind: "failed", entry, error: new Error(`HTTP ${res.status}`), response };
  if (res.status === 409 && problemType(body).endsWith("outcome-unknown")) return { kind: "unknown", entry, response };
  const stored = entry.origin === undefined ? undefined : await journal.retention(entry.origin);
  await journal.record(entry.key, answerOf(res, body, advertised ?? stored ?? keyRetentionMs));
  const kind = res.status >= 400 && res.status < 500 ? "refused" : "answered";
  return { kind, entry, status: res.status, body, response };
}

/**
 * Finishes what a crashed process left: every unanswered entry of the
 * journal is sent again with its own key by `send` (retried as `withRetry`
 * does), except an expired one, which is NEVER sent (the server may have
 * forgotten the key and would run it again) and is reported for the caller
 * to check. The answers are recorded. `send` gets the entry, whose `request`
 * holds what the client's methods sent; the client's `resume()` is this with
 * a `send` that re-sends it.
 */
export async function resume(
  journal: Journal,
  send: (entry: JournalEntry, attempt: number) => Promise<Response>,
  options: Partial<RetryOptions> & { keyRetentionMs?: number; now?: number } = {},
): Promise<Outcome[]> {
  const { keyRetentionMs = DEFAULT_KEY_RETENTION_MS, now, ...retry } = options;
  const outcomes: Outcome[] = [];
  for (const p of await pending(journal, { keyRetentionMs, now: now ?? Date.now() })) {
    if (p.expired) {
      outcomes.push({ kind: "expired", entry: p.entry, expiredAt: p.expiresAt });
      continue;
    }
    try {
      const res = await oneAtATime(journal, p.entry.intent, () => withRetry((n) => send(p.entry, n), retry));
      outcomes.push(await settle(journal, p.entry, res, await res.text(), keyRetentionMs));
    } catch (error) {
      outcomes.push({ kind: "failed", entry: p.entry, error });
    }
  }
  return outcomes;
}

/** A result's body text: a Response's (from a clone, the caller still reads it) or openapi-fetch's parsed data/error. */
async function bodyText(result: HasResponse): Promise<string> {
  if (!("response" in result)) return result.bodyUsed ? "" : result.clone().text();
  const { data, error } = result as { data?: unknown; error?: unknown };
  const v = data ?? error;
  return v === undefined ? "" : typeof v === "string" ? v : JSON.stringify(v);
}

/** A response with the body already read, put back as text. */
function rebuilt(res: Response, body: string): Response {
  return new Response(res.status === 204 || res.status === 205 || res.status === 304 ? null : body, {
    status: res.status,
    headers: res.headers,
  });
}

function problemType(body: string): string {
  try {
    const type = (JSON.parse(body) as { type?: unknown }).type;
    return typeof type === "string" ? type : "";
  } catch {
    return "";
  }
}

function responseOf(r: HasResponse): Response {
  return "response" in r ? r.response : r;
}

/** Frees the connection of a response nobody will read (raw fetch results). */
async function discardBody(res: Response): Promise<void> {
  if (res.body && !res.bodyUsed) await res.body.cancel().catch(() => {});
}

function isAbort(err: unknown): boolean {
  return err instanceof Error && err.name === "AbortError";
}

function sleep(ms: number): Promise<void> {
  return ms > 0 ? new Promise((resolve) => setTimeout(resolve, ms)) : Promise.resolve();
}
