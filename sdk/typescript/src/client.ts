import createFetchClient, { type Client } from "openapi-fetch";
import type { components, paths } from "./schema.js";
import {
  DEFAULT_RETRY,
  idempotent,
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
}

export interface CreateOrderOptions {
  /** A key you persisted for this order; default a fresh UUID. See IdempotentOptions.key. */
  idempotencyKey?: string;
}

export interface OncekeyClient {
  /** Creates an order exactly once, however many attempts it takes. */
  createOrder(body: NewOrder, options?: CreateOrderOptions): Promise<Order>;
  getOrder(id: string): Promise<Order>;
  /** One page, newest first; pass `next_cursor` back as `cursor` for the next. */
  listOrders(query?: { limit?: number; cursor?: string }): Promise<OrderPage>;
  /**
   * The retry helper with this client's retry settings, for operations the
   * methods above do not cover yet: `op` gets the key to send.
   */
  idempotent<R extends HasResponse>(
    op: (key: string, attempt: number) => Promise<R>,
    options?: IdempotentOptions,
  ): Promise<R>;
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

  return {
    api,

    idempotent: (op, opts) => idempotent(op, { ...retry, ...opts }),

    async createOrder(body, opts = {}) {
      const { data, error, response } = await idempotent(
        (key) => api.POST("/orders", { params: { header: { "Idempotency-Key": key } }, body }),
        { ...retry, key: opts.idempotencyKey },
      );
      // 201 is the only success (its body is the Order, hence the cast: data
      // is typed as any 2xx body); a 202 that outlived the retries is a problem.
      if (response.status === 201 && data) return data as Order;
      throw new OncekeyProblemError(toProblem(error ?? data, response), response);
    },

    async getOrder(id) {
      // GETs change nothing, so plain retries are safe without a key.
      const { data, error, response } = await withRetry(
        () => api.GET("/orders/{id}", { params: { path: { id } } }),
        retry,
      );
      if (data) return data;
      throw new OncekeyProblemError(toProblem(error, response), response);
    },

    async listOrders(query = {}) {
      const { data, error, response } = await withRetry(
        () => api.GET("/orders", { params: { query } }),
        retry,
      );
      if (data) return data;
      throw new OncekeyProblemError(toProblem(error, response), response);
    },
  };
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
