/**
 * Oncekey TypeScript SDK: a typed client generated from openapi.yaml
 * (openapi-typescript + openapi-fetch) with idempotent retries.
 */
export {
  createClient,
  OncekeyProblemError,
  toProblem,
  type BonusBalance,
  type BonusEntry,
  type BonusEntryResult,
  type ClientOptions,
  type CreateOrderOptions,
  type Health,
  type NewBonusEntry,
  type NewOrder,
  type NewPayment,
  type NewRefund,
  type OncekeyClient,
  type OperationOptions,
  type Order,
  type OrderItem,
  type OrderPage,
  type OrderPatch,
  type Payment,
  type Problem,
  type Refund,
  type RefundList,
} from "./client.js";
export {
  DEFAULT_RETRY,
  idempotent,
  isInProgress,
  isRetryable,
  isRetryableStatus,
  retryDelayMs,
  withRetry,
  type HasResponse,
  type IdempotentOptions,
  type RetryOptions,
} from "./retry.js";
export type { components, operations, paths } from "./schema.js";
