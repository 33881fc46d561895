/**
 * Idempotent retries: the one piece of client logic Oncekey needs.
 *
 * The server makes a POST exactly-once *per Idempotency-Key*, so the client's
 * whole job is to name each logical operation once and to send that same name
 * on every retry of it. A fresh key per attempt would turn a timeout into a
 * duplicate order; a key reused for a different operation would get a 409.
 */

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

/** Options for `idempotent`: retry tuning plus an optional fixed key. */
export interface IdempotentOptions extends Partial<RetryOptions> {
  /**
   * The operation's Idempotency-Key. Default: a fresh crypto.randomUUID().
   * Pass your own when the operation must survive a restart of this process
   * (persist the key with the intent, e.g. next to the cart, before the first
   * attempt), since a new process would otherwise mint a new key.
   */
  key?: string;
}

/**
 * Runs one logical unsafe operation exactly once: picks ONE Idempotency-Key
 * and passes it to every attempt, retrying as `withRetry` does. The operation
 * must send `key` as its Idempotency-Key header and the same request every
 * time (the server answers 409 to the same key with a different request).
 *
 * @example
 *   const { data, response } = await idempotent((key) =>
 *     api.POST("/orders", { params: { header: { "Idempotency-Key": key } }, body }));
 */
export function idempotent<R extends HasResponse>(
  operation: (key: string, attempt: number) => Promise<R>,
  options: IdempotentOptions = {},
): Promise<R> {
  const { key = crypto.randomUUID(), ...retry } = options;
  return withRetry((n) => operation(key, n), retry);
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
