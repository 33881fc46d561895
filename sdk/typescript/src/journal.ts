/**
 * The key journal: where a client writes an operation's Idempotency-Key
 * before its first attempt, so that a process which dies between sending a
 * request and reading its answer finds the key again on restart instead of
 * minting a new one (a new key is a second order).
 *
 * This module is browser-safe (WebCrypto only). The durable, file-backed
 * journal for Node.js is `@oncekey/sdk/journal-file`; an IndexedDB one fits
 * the same `Journal` interface, whose methods are all async for that reason.
 */

/** The answer a journaled operation got, as stored. */
export interface JournalAnswer {
  status: number;
  /** The headers worth keeping (Content-Type, Location, Idempotency-TTL, …), lower-case names. */
  headers: Record<string, string>;
  /** The body as text, at most MAX_BODY_CHARS; `truncated` says when it was cut. */
  body: string;
  truncated?: boolean;
  /** When it was recorded (ms since the epoch). */
  answeredAt: number;
  /** How long the server keeps the key (and so how long this entry is kept), ms. */
  retentionMs: number;
}

/** What resume needs to send a journaled request again. */
export interface JournalRequest {
  method: string;
  /** Path and query, relative to the entry's origin. */
  path: string;
  body?: string;
  contentType?: string;
}

/** One journaled operation: written before its first attempt. */
export interface JournalEntry {
  key: string;
  /** Method and path, e.g. "POST /orders": re-running an intent as another operation is an error. */
  operation: string;
  /** SHA-256 (hex) of the request body: re-running an intent with another body is an error. */
  bodyHash: string;
  /** The caller's name for the operation ("checkout cart 123"); a re-run with it reuses the key. */
  intent?: string;
  /** The server's origin, whose advertised retention applies. */
  origin?: string;
  /** When it was appended (ms since the epoch), before anything was sent. */
  createdAt: number;
  /** The request, when it was small enough to keep (≤ MAX_BODY_CHARS): resume re-sends it. */
  request?: JournalRequest;
  answer?: JournalAnswer;
}

/**
 * Where keys are kept. `append` must be durable when it resolves: the
 * operation is sent only after it does, so a crash after the send finds it.
 */
export interface Journal {
  /** Writes a new entry durably. */
  append(entry: JournalEntry): Promise<void>;
  /** Records the final answer of the entry with this key. */
  record(key: string, answer: JournalAnswer): Promise<void>;
  /** Every entry without an answer, oldest first. */
  pending(): Promise<JournalEntry[]>;
  /** The newest entry appended under this intent, if any. */
  byIntent(intent: string): Promise<JournalEntry | undefined>;
  /** Remembers the retention a server advertised (`Idempotency-TTL`), per origin. */
  setRetention(origin: string, ms: number): Promise<void>;
  /** The last retention recorded for this origin. */
  retention(origin: string): Promise<number | undefined>;
  /** Drops an entry: e.g. an expired one, once the caller has checked the resource itself. */
  forget(key: string): Promise<void>;
  /** Drops answered entries older than their retention (and forgotten ones). */
  compact(now?: number): Promise<void>;
}

/** The most of a body (and of a request body kept for resume) a journal stores. */
export const MAX_BODY_CHARS = 64 * 1024;

/** The default retention of a key when the server advertised none: 24 hours. */
export const DEFAULT_KEY_RETENTION_MS = 24 * 60 * 60 * 1000;

/** Whether an answered entry is past its retention at `now`: what `compact` drops (for a journal of your own). */
export function isAnswerExpired(answer: JournalAnswer, now: number): boolean {
  return answer.answeredAt + answer.retentionMs < now;
}

/**
 * The entries and retentions a journal holds, with the queries every journal
 * answers the same way: MemoryJournal is this alone, the file journal this
 * beside its file. Not part of the package's API (index.ts leaves it out).
 * @internal
 */
export class JournalState {
  readonly entries = new Map<string, JournalEntry>();
  readonly retentions = new Map<string, number>();

  /** Records answer on key's entry, if the journal still holds it. */
  answer(key: string, answer: JournalAnswer): void {
    const entry = this.entries.get(key);
    if (entry) entry.answer = answer;
  }

  /** The entries never answered, copied. */
  pending(): JournalEntry[] {
    return [...this.entries.values()].filter((e) => !e.answer).map((e) => structuredClone(e));
  }

  /** The newest entry of intent, copied. */
  byIntent(intent: string): JournalEntry | undefined {
    const found = [...this.entries.values()].filter((e) => e.intent === intent).pop();
    return found && structuredClone(found);
  }

  /** Whether an answered entry is past its retention at now. */
  anyExpired(now: number): boolean {
    return [...this.entries.values()].some((e) => e.answer && isAnswerExpired(e.answer, now));
  }

  /** Drops the answered entries past their retention at now. */
  dropExpired(now: number): void {
    for (const [key, e] of this.entries) if (e.answer && isAnswerExpired(e.answer, now)) this.entries.delete(key);
  }
}

/**
 * A journal in memory: what a test, or a process that only needs one intent
 * to run once at a time, wants. It dies with the process, so it does not
 * survive a crash; use `@oncekey/sdk/journal-file` for that.
 */
export class MemoryJournal implements Journal {
  readonly #state = new JournalState();

  async append(entry: JournalEntry): Promise<void> {
    this.#state.entries.set(entry.key, structuredClone(entry));
  }

  async record(key: string, answer: JournalAnswer): Promise<void> {
    this.#state.answer(key, structuredClone(answer));
  }

  async pending(): Promise<JournalEntry[]> {
    return this.#state.pending();
  }

  async byIntent(intent: string): Promise<JournalEntry | undefined> {
    return this.#state.byIntent(intent);
  }

  async setRetention(origin: string, ms: number): Promise<void> {
    this.#state.retentions.set(origin, ms);
  }

  async retention(origin: string): Promise<number | undefined> {
    return this.#state.retentions.get(origin);
  }

  async forget(key: string): Promise<void> {
    this.#state.entries.delete(key);
  }

  async compact(now = Date.now()): Promise<void> {
    this.#state.dropExpired(now);
  }
}

/**
 * What became of a journaled operation, as `resume` reports it. The kinds
 * need different handling, so they are distinct:
 * - answered: a final answer other than a 4xx (normally a 2xx): done.
 * - refused: a stored 4xx: the request was wrong or the key bound elsewhere; resending cannot help.
 * - unknown: `409 …/outcome-unknown`: the server took the request and never
 *   learned its result; an operator settles it. Kept pending.
 * - inProgress: a `202` request-in-progress that outlived the retries. Kept pending.
 * - expired: older than the server's retention: NEVER resent (the server may
 *   have forgotten the key and would run it again); check the resource, then `forget` it.
 * - failed: no answer (network errors or 5xx after every attempt). Kept pending.
 */
export type Outcome =
  | { kind: "answered"; entry: JournalEntry; status: number; body: string; response: Response }
  | { kind: "refused"; entry: JournalEntry; status: number; body: string; response: Response }
  | { kind: "unknown"; entry: JournalEntry; response: Response }
  | { kind: "inProgress"; entry: JournalEntry; response: Response }
  | { kind: "expired"; entry: JournalEntry; expiredAt: number }
  | { kind: "failed"; entry: JournalEntry; error: unknown; response?: Response };

/**
 * Re-running an intent as another operation or with another body: the key is
 * bound to the first, and the server would answer 409 anyway.
 */
export class IntentMismatchError extends Error {
  override readonly name = "IntentMismatchError";
  constructor(readonly entry: JournalEntry) {
    super(`intent ${JSON.stringify(entry.intent)} was journaled as ${entry.operation} with another request body`);
  }
}

/**
 * Re-running an intent whose unanswered entry is older than the server's
 * retention: the key may be forgotten server-side, so sending it could run
 * the operation a second time. Check the resource, then `journal.forget(entry.key)`.
 */
export class IntentExpiredError extends Error {
  override readonly name = "IntentExpiredError";
  constructor(readonly entry: JournalEntry, readonly expiredAt: number) {
    super(`intent ${JSON.stringify(entry.intent)} (key ${entry.key}) expired unanswered at ${new Date(expiredAt).toISOString()}`);
  }
}

/** SHA-256 of the text's UTF-8, hex, with WebCrypto (browsers and Node.js alike). @internal (not exported by the package) */
export async function sha256Hex(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** The headers an answer keeps: enough to rebuild what a caller reads. */
const KEPT_HEADERS = ["content-type", "location", "retry-after", "idempotency-key", "idempotent-replayed", "idempotency-ttl"];

/** A response's answer as a journal stores it; `body` is its text, already read. @internal (not exported by the package) */
export function answerOf(res: Response, body: string, retentionMs: number, now = Date.now()): JournalAnswer {
  const headers: Record<string, string> = {};
  for (const name of KEPT_HEADERS) {
    const v = res.headers.get(name);
    if (v != null) headers[name] = v;
  }
  const answer: JournalAnswer = { status: res.status, headers, body: body.slice(0, MAX_BODY_CHARS), answeredAt: now, retentionMs };
  if (body.length > MAX_BODY_CHARS) answer.truncated = true;
  return answer;
}

/** A fetch Response rebuilt from a stored answer (no body where HTTP allows none). @internal (not exported by the package) */
export function responseOf(answer: JournalAnswer): Response {
  const bodyless = answer.status === 204 || answer.status === 205 || answer.status === 304;
  return new Response(bodyless ? null : answer.body, { status: answer.status, headers: answer.headers });
}

/** `Idempotency-TTL: <delta-seconds>` in ms, or undefined when absent or malformed. @internal (not exported by the package) */
export function advertisedRetentionMs(res: Response): number | undefined {
  const v = res.headers.get("Idempotency-TTL");
  return v != null && /^\s*\d+\s*$/.test(v) ? Number(v) * 1000 : undefined;
}

/**
 * When an unanswered entry stops being safe to send: its creation (before
 * the first send, so never later than the server's clock starts) plus the
 * origin's advertised retention, else `keyRetentionMs`.
 * @internal (not exported by the package)
 */
export async function expiresAt(journal: Journal, entry: JournalEntry, keyRetentionMs = DEFAULT_KEY_RETENTION_MS): Promise<number> {
  const advertised = entry.origin === undefined ? undefined : await journal.retention(entry.origin);
  return entry.createdAt + (advertised ?? keyRetentionMs);
}

/** An unanswered entry and whether it may still be sent. */
export interface PendingEntry {
  entry: JournalEntry;
  expiresAt: number;
  expired: boolean;
}

/** The journal's unanswered entries, each with its expiry (see `expiresAt`). */
export async function pending(
  journal: Journal,
  options: { now?: number; keyRetentionMs?: number } = {},
): Promise<PendingEntry[]> {
  const now = options.now ?? Date.now();
  const out: PendingEntry[] = [];
  for (const entry of await journal.pending()) {
    const at = await expiresAt(journal, entry, options.keyRetentionMs);
    out.push({ entry, expiresAt: at, expired: at < now });
  }
  return out;
}
