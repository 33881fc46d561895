/**
 * Oncekey TypeScript SDK: a typed client generated from openapi.yaml
 * (openapi-typescript + openapi-fetch) with idempotent retries and a key
 * journal interface (the file journal is `@oncekey/sdk/journal-file`, kept
 * out of this entry so a browser bundle never pulls in `node:fs`).
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
  resume,
  isRetryable,
  isRetryableStatus,
  retryDelayMs,
  withRetry,
  type HasResponse,
  type IdempotentOptions,
  type JournaledOptions,
  type RetryOptions,
} from "./retry.js";
export {
  DEFAULT_KEY_RETENTION_MS,
  IntentExpiredError,
  IntentMismatchError,
  isAnswerExpired,
  MAX_BODY_CHARS,
  MemoryJournal,
  pending,
  type Journal,
  type JournalAnswer,
  type JournalEntry,
  type JournalRequest,
  type Outcome,
  type PendingEntry,
} from "./journal.js";
export type { components, operations, paths } from "./schema.js";
