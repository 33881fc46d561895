import createFetchClient, { type Client } from "openapi-fetch";
import type { components, paths } from "./schema.js";
import type { Journal, JournalEntry, JournalRequest, Outcome } from "./journal.js";
import {
  DEFAULT_RETRY,
  idempotent,
  isInProgress,
  journaled,
  resume,
  withRetry,
  type HasResponse,
  type IdempotentOptions,
  type RetryOptions,
} from "./retry.js";

// Friendly names for the generated types (src/schema.d.ts, from openapi.yaml).
export type Order = components["schemas"]["Order"];
export type NewOrder = components["schemas"]["NewOrder"];
export type OrderItem = components["schemas"]["OrderItem"];
export type OrderPage = components["schemas"]["OrderPage"];
export type OrderPatch = components["schemas"]["OrderPatch"];
export type Refund = components["schemas"]["Refund"];
export type NewRefund = components["schemas"]["NewRefund"];
export type RefundList = components["schemas"]["RefundList"];
export type Payment = components["schemas"]["Payment"];
export type NewPayment = components["schemas"]["NewPayment"];
export type BonusEntry = components["schemas"]["BonusEntry"];
export type BonusEntryResult = components["schemas"]["BonusEntryResult"];
export type NewBonusEntry = components["schemas"]["NewBonusEntry"];
export type BonusBalance = components["schemas"]["BonusBalance"];
export type Health = components["schemas"]["Health"];
export type Problem = components["schemas"]["Problem"];

/**
 * A non-success answer from Oncekey, carrying its RFC 9457 problem. Branch on
 * `problem.type` (stable, see docs/problems.md), not on the message.
 */
export class OncekeyProblemError extends Error {
  override readonly name = "OncekeyProblemError";
  readonly status: number;
  readonly problem: Problem;
  /** The final response (already read); its headers may help, e.g. Idempotency-Key. */
  readonly response: Response;

  constructor(problem: Problem, response: Response) {
    super(`${response.status} ${problem.title}${problem.detail ? `: ${problem.detail}` : ""}`);
    this.status = response.status;
    this.problem = problem;
    this.response = response;
  }
}

export interface ClientOptions {
  /** E.g. "http://127.0.0.1:8080" (no trailing path needed). */
  baseUrl: string;
  /** The account's API key; sent as `Authorization: Bearer …`. */
  apiKey: string;
  /** Retry tuning for every call; see RetryOptions for the defaults. */
  retry?: Partial<RetryOptions>;
  /** A fetch to use instead of the global one (proxies, tests). */
  fetch?: typeof globalThis.fetch;
  /**
   * A key journal: every unsafe call writes its key there before sending, so
   * a call re-run after a crash with the same `intent` reuses it (see the
   * README's "Key journal"). Without one, keys live in memory only.
   */
  journal?: Journal;
  /** With a journal: an unanswered key's retention when the server advertised no `Idempotency-TTL`. Default 24 h. */
  keyRetentionMs?: number;
}

/**
 * Options of one unsafe operation (createOrder, updateOrder, cancelOrder,
 * createPayment, createRefund, createBonusCredit, createBonusDebit).
 */
export interface OperationOptions {
  /** A key you persisted for this operation; default a fresh UUID. See IdempotentOptions.key. */
  idempotencyKey?: string;
  /**
   * With the client's journal: the name of this one logical operation,
   * stable across restarts ("checkout cart 123"). A call with an intent
   * already journaled reuses its key, or returns its stored answer without
   * sending.
   */
  intent?: string;
}

/** createOrder's options (the same as every unsafe operation's). */
export type CreateOrderOptions = OperationOptions;

export interface OncekeyClient {
  /** Creates an order exactly once, however many attempts it takes. */
  createOrder(body: NewOrder, options?: CreateOrderOptions): Promise<Order>;
  getOrder(id: string): Promise<Order>;
  /** One page, newest first; pass `next_cursor` back as `cursor` for the next. */
  listOrders(query?: { limit?: number; cursor?: string }): Promise<OrderPage>;
  /**
   * Changes an unpaid order exactly once, as createOrder creates one. `patch`
   * is sent as a JSON Merge Patch (`application/merge-patch+json`): members
   * left out keep their value, `items` replaces the items as a whole.
   * Returns the order right after this change. A cancelled order, or one
   * with a pending or succeeded payment, is a 409 `order-not-modifiable`.
   */
  updateOrder(id: string, patch: OrderPatch, options?: OperationOptions): Promise<Order>;
  /**
   * Cancels an unpaid order exactly once and returns it cancelled (`status`
   * `cancelled`, `cancelled_at`); one cancelled before is returned as it is.
   * An order with a pending or succeeded payment is a 409
   * `order-not-cancellable`.
   */
  cancelOrder(id: string, options?: OperationOptions): Promise<Order>;
  /**
   * Refunds part or all of a succeeded payment exactly once. A refund is a
   * long operation: it resolves to the refund as accepted, `pending` (or
   * final, when a retry came after it became final); poll `getRefund` until
   * it is `succeeded` or `failed`. A payment that has not succeeded is a 409
   * `payment-not-refundable`; more than is left of it a 422
   * `refund-exceeds-payment`, one refund too many a 422 `too-many-refunds`.
   */
  createRefund(paymentId: string, body: NewRefund, options?: OperationOptions): Promise<Refund>;
  /** One refund; while it is `pending`, look again after the answer's Retry-After. */
  getRefund(id: string): Promise<Refund>;
  /** Every refund of a payment, oldest first. */
  listRefunds(paymentId: string): Promise<RefundList>;
  /**
   * Pays for an order exactly once. A payment is a long operation: it
   * resolves to the payment as accepted, `pending` (or final, when a retry
   * came after it became final); poll `getPayment` until it is `succeeded`
   * or `failed`. An order is paid at most once whatever key each attempt
   * carries: while it has a pending payment another is a 409
   * `payment-in-progress`, once it is paid a 409 `order-already-paid`; an
   * amount or currency other than the order's is a 422
   * `payment-amount-mismatch`.
   */
  createPayment(body: NewPayment, options?: OperationOptions): Promise<Payment>;
  /** One payment; while it is `pending`, look again after the answer's Retry-After. */
  getPayment(id: string): Promise<Payment>;
  /**
   * Credits bonuses to the caller's balance exactly once; resolves to the
   * entry and the balance right after it. A credit that would take the
   * balance beyond 10^18 is a 422 `balance-limit-exceeded`, stored under the
   * key: a new attempt needs a new call.
   */
  createBonusCredit(body: NewBonusEntry, options?: OperationOptions): Promise<BonusEntryResult>;
  /**
   * Debits bonuses from the caller's balance exactly once. A debit larger
   * than the balance is a 422 `insufficient-funds`, stored under the key: the
   * same operation never succeeds later because credits arrived in between.
   */
  createBonusDebit(body: NewBonusEntry, options?: OperationOptions): Promise<BonusEntryResult>;
  /** The caller's bonus balance (0 before any credit). */
  getBonusBalance(): Promise<BonusBalance>;
  /** Whether the service's process is up (GET /healthz); a probe, not retried. */
  getHealth(): Promise<Health>;
  /** Whether the service can serve, its database answering (GET /readyz); a probe, not retried: not ready is a 503. */
  getReadiness(): Promise<Health>;
  /** The contract the service enforces: its openapi.yaml, as text. */
  getSpec(): Promise<string>;
  /** The service's API reference page (HTML, for browsers). */
  getDocs(): Promise<string>;
  /**
   * The retry helper with this client's retry settings, for calls the
   * methods above do not make (a request of your own shape): `op` gets the
   * key to send.
   */
  idempotent<R extends HasResponse>(
    op: (key: string, attempt: number) => Promise<R>,
    options?: IdempotentOptions,
  ): Promise<R>;
  /**
   * With a journal: sends every unanswered journaled request of this server
   * again with its own key (an expired one never), records the answers, and
   * reports each outcome. Without a journal: an empty list.
   */
  resume(): Promise<Outcome[]>;
  /** The typed openapi-fetch client (auth set, no retries) for everything else. */
  api: Client<paths>;
}

export function createClient(options: ClientOptions): OncekeyClient {
  const retry: RetryOptions = { ...DEFAULT_RETRY, ...options.retry };
  const api = createFetchClient<paths>({
    baseUrl: options.baseUrl,
    headers: { Authorization: `Bearer ${options.apiKey}` },
    fetch: options.fetch,
  });

  const fetcher = options.fetch ?? globalThis.fetch;
  const base = options.baseUrl.replace(/\/+$/, "");
  const { journal, keyRetentionMs } = options;

  /**
   * Runs one logical unsafe operation: `op` sends `request` with the key.
   * With a journal, `request` is what is hashed, kept and re-sent by resume.
   */
  const once = <T>(
    op: (key: string) => Promise<Answer>,
    opts: OperationOptions = {},
    request: JournalRequest,
  ): Promise<T> => {
    if (!journal) return idempotent(op, { ...retry, key: opts.idempotencyKey }).then(valueOf<T>);
    const journaledOptions = { ...retry, journal, request, origin: base, keyRetentionMs, key: opts.idempotencyKey, intent: opts.intent };
    return journaled(op, journaledOptions, answerText, answerFromResponse).then(valueOf<T>);
  };
  const json = (method: string, path: string, body: unknown, contentType = "application/json"): JournalRequest => ({
    method,
    path,
    body: JSON.stringify(body),
    contentType,
  });
  /** Re-sends a journaled request as it was sent, with its key. */
  const resend = (entry: JournalEntry): Promise<Response> => {
    const r = entry.request;
    if (!r || entry.origin !== base) {
      return Promise.reject(new Error(`entry ${entry.key} holds no request for ${base}: resume it with resume(journal, send)`));
    }
    const headers: Record<string, string> = { Authorization: `Bearer ${options.apiKey}`, "Idempotency-Key": entry.key };
    if (r.contentType) headers["Content-Type"] = r.contentType;
    return fetcher(base + r.path, { method: r.method, headers, body: r.body ?? null });
  };
  // GETs change nothing, so plain retries are safe without a key.
  const read = <T>(op: () => Promise<Answer>) => withRetry(op, retry).then(valueOf<T>);
  const withKey = (key: string) => ({ header: { "Idempotency-Key": key } });

  return {
    api,

    idempotent: (op, opts) => idempotent(op, { ...retry, ...opts }),

    resume: () => (journal ? resume(journal, resend, { ...retry, keyRetentionMs }) : Promise.resolve([])),

    createOrder: (body, opts) => once<Order>((key) => api.POST("/orders", { params: withKey(key), body }), opts, json("POST", "/orders", body)),

    getOrder: (id) => read<Order>(() => api.GET("/orders/{id}", { params: { path: { id } } })),

    listOrders: (query = {}) => read<OrderPage>(() => api.GET("/orders", { params: { query } })),

    updateOrder: (id, patch, opts) =>
      once<Order>(
        (key) =>
          api.PATCH("/orders/{id}", {
            params: { path: { id }, ...withKey(key) },
            body: patch,
            headers: { "Content-Type": "application/merge-patch+json" },
          }),
        opts,
        json("PATCH", `/orders/${encodeURIComponent(id)}`, patch, "application/merge-patch+json"),
      ),

    cancelOrder: (id, opts) =>
      once<Order>((key) => api.DELETE("/orders/{id}", { params: { path: { id }, ...withKey(key) } }), opts, {
        method: "DELETE",
        path: `/orders/${encodeURIComponent(id)}`,
      }),

    createRefund: (paymentId, body, opts) =>
      once<Refund>(
        (key) => api.POST("/payments/{id}/refunds", { params: { path: { id: paymentId }, ...withKey(key) }, body }),
        opts,
        json("POST", `/payments/${encodeURIComponent(paymentId)}/refunds`, body),
      ),

    getRefund: (id) => read<Refund>(() => api.GET("/refunds/{id}", { params: { path: { id } } })),

    listRefunds: (paymentId) =>
      read<RefundList>(() => api.GET("/payments/{id}/refunds", { params: { path: { id: paymentId } } })),

    createPayment: (body, opts) => once<Payment>((key) => api.POST("/payments", { params: withKey(key), body }), opts, json("POST", "/payments", body)),

    getPayment: (id) => read<Payment>(() => api.GET("/payments/{id}", { params: { path: { id } } })),

    createBonusCredit: (body, opts) =>
      once<BonusEntryResult>(
        (key) => api.POST("/bonus/credits", { params: withKey(key), body }),
        opts,
        json("POST", "/bonus/credits", body),
      ),

    createBonusDebit: (body, opts) =>
      once<BonusEntryResult>(
        (key) => api.POST("/bonus/debits", { params: withKey(key), body }),
        opts,
        json("POST", "/bonus/debits", body),
      ),

    getBonusBalance: () => read<BonusBalance>(() => api.GET("/bonus/balance")),

    // Probes: their answer is the service's state now, so they are not retried.
    getHealth: () => api.GET("/healthz").then(valueOf<Health>),

    getReadiness: () => api.GET("/readyz").then(valueOf<Health>),

    // Neither is JSON: read as text, not parsed.
    getSpec: () => read<string>(() => api.GET("/openapi.yaml", { parseAs: "text" })),

    getDocs: () => read<string>(() => api.GET("/docs", { parseAs: "text" })),
  };
}

/** What an openapi-fetch call resolves to. */
interface Answer {
  data?: unknown;
  error?: unknown;
  response: Response;
}

/** An openapi-fetch result's body as text: openapi-fetch has read the response, so its parsed data or error. */
async function answerText({ data, error }: Answer): Promise<string> {
  const v = data ?? error;
  return v === undefined ? "" : typeof v === "string" ? v : JSON.stringify(v);
}

/** A stored answer as openapi-fetch would have given it: JSON parsed, data on success, error otherwise. */
async function answerFromResponse(res: Response): Promise<Answer> {
  const text = await res.clone().text();
  let value: unknown = text;
  if (/json/i.test(res.headers.get("Content-Type") ?? "") && text !== "") value = JSON.parse(text);
  return res.ok ? { data: value, response: res } : { error: value, response: res };
}

/**
 * The body of a final success, typed as the operation's success body T: any
 * 2xx but a 202 request-in-progress (which outlived the retries). A long
 * operation's 202 with its accepted resource is a success. Anything else
 * throws its problem.
 */
function valueOf<T>({ data, error, response }: Answer): T {
  if (response.ok && !isInProgress(response) && data != null) return data as T;
  throw new OncekeyProblemError(toProblem(error ?? data, response), response);
}

/**
 * The problem in a failed response's body. Oncekey always sends one, but a
 * proxy in between may not, so anything else becomes an `about:blank`
 * problem with the HTTP status (RFC 9457 §4.2.1).
 */
export function toProblem(body: unknown, response: Response): Problem {
  if (
    typeof body === "object" && body !== null &&
    typeof (body as Problem).type === "string" &&
    typeof (body as Problem).title === "string" &&
    typeof (body as Problem).status === "number"
  ) {
    return body as Problem;
  }
  const problem: Problem = {
    type: "about:blank",
    title: response.statusText || `HTTP ${response.status}`,
    status: response.status,
  };
  if (typeof body === "string" && body !== "") problem.detail = body.slice(0, 500);
  return problem;
}
