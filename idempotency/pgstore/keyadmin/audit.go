package keyadmin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/access"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// Why Resolve and Release refuse a change (besides ErrKeyNotFound). Each
// refusal is written to the audit trail too.
var (
	// ErrNotHeld: the key holds an operation's outcome (or one being
	// committed), not a held operation: there is nothing to settle.
	ErrNotHeld = errors.New("keyadmin: the key holds an outcome, not a held operation")
	// ErrStillRunning: the key's operation runs on its holder, within its
	// lease; the holder settles it, or its lease ends.
	ErrStillRunning = errors.New("keyadmin: the key's operation is running on its holder")
)

// Change names one operator's change of one key, and says who made it and
// why, for the audit trail. Actor and Reason are required.
type Change struct {
	Scope string
	Key   string
	// Actor is who makes the change, as the operator's tool names them
	// (a login, an email); the trail also keeps the database role.
	Actor string
	// Reason says why: a ticket, who checked the upstream.
	Reason string
}

// maxActor and maxReason are the audit table's bounds.
const maxActor, maxReason = 255, 1000

func (c Change) check() error {
	switch {
	case strings.TrimSpace(c.Actor) == "":
		return errors.New("keyadmin: a change names its actor")
	case len(c.Actor) > maxActor:
		return fmt.Errorf("keyadmin: the actor is %d bytes; at most %d", len(c.Actor), maxActor)
	case strings.TrimSpace(c.Reason) == "":
		return errors.New("keyadmin: a change gives its reason")
	case len(c.Reason) > maxReason:
		return fmt.Errorf("keyadmin: the reason is %d bytes; at most %d", len(c.Reason), maxReason)
	}
	return nil
}

// The audit trail's actions and outcomes (AuditEntry).
const (
	ActionResolve = "resolve"
	ActionRelease = "release"

	OutcomeDone    = "done"
	OutcomeRefused = "refused"
)

// stateAbsent is AuditEntry.PreviousState of a key that was not there.
const stateAbsent = "absent"

// AuditEntry is one row of the audit trail: an operator's attempt to
// resolve or release a key, made or refused.
type AuditEntry struct {
	ID int64     `json:"id"`
	At time.Time `json:"at"` // the database's clock
	// Actor is who the operator's tool said made the change;
	// DatabaseUser the role that PostgreSQL authenticated.
	Actor        string `json:"actor"`
	DatabaseUser string `json:"database_user"`
	// Action is ActionResolve or ActionRelease.
	Action string `json:"action"`
	Scope  string `json:"scope"`
	Key    string `json:"idempotency_key"`
	// PreviousState is the key's state when the attempt read it, as
	// KeyInfo.Status says it (held, unknown, not-stored, completed,
	// processing), or "absent".
	PreviousState string `json:"previous_state"`
	// Outcome is OutcomeDone or OutcomeRefused, and Refusal says why a
	// refused attempt was refused.
	Outcome string `json:"outcome"`
	Refusal string `json:"refusal,omitempty"`
	Reason  string `json:"reason"`
	// ResponseStatus is the status a resolve gave.
	ResponseStatus int `json:"response_status,omitempty"`
	// BodySHA256 is the hex SHA-256 of the body a resolve stored (or would
	// have), or of the held record a release deleted (or found).
	BodySHA256 string `json:"body_sha256,omitempty"`
}

// Resolve settles the held key c names, whose outcome is unknown (or not
// stored), with resp: the answer its operation gave, found out by hand.
// Its retries replay resp. The change and its audit row commit together;
// a refusal (ErrKeyNotFound, ErrNotHeld, ErrStillRunning) writes an audit
// row of its own.
func Resolve(ctx context.Context, store *pgstore.Store, c Change, resp idempotency.Response) (AuditEntry, error) {
	sum := sha256.Sum256(resp.Body)
	entry := AuditEntry{Action: ActionResolve, ResponseStatus: resp.Status, BodySHA256: hex.EncodeToString(sum[:])}
	return change(ctx, store, c, entry, func(tx pgx.Tx, ref idempotency.Ref) (bool, error) {
		return access.Settle(ctx, store, tx, ref, resp)
	})
}

// Release deletes the held record of the key c names, whose outcome is
// unknown (or not stored), once its operation is known not to have run:
// its next retry runs it. The change and its audit row commit together; a
// refusal (ErrKeyNotFound, ErrNotHeld, ErrStillRunning) writes an audit
// row of its own.
func Release(ctx context.Context, store *pgstore.Store, c Change) (AuditEntry, error) {
	return change(ctx, store, c, AuditEntry{Action: ActionRelease}, func(tx pgx.Tx, ref idempotency.Ref) (bool, error) {
		return access.Release(ctx, store, tx, ref)
	})
}

// change runs apply on the held key c names in a transaction that locks
// its row first, judges the state it finds, and writes entry to the audit
// trail before it commits; or, refused, rolls back and writes entry as
// refused in a transaction of its own.
func change(ctx context.Context, store *pgstore.Store, c Change, entry AuditEntry, apply func(pgx.Tx, idempotency.Ref) (bool, error)) (AuditEntry, error) {
	if err := c.check(); err != nil {
		return AuditEntry{}, err
	}
	scope, err := access.ScopeArg(store, c.Scope)
	if err != nil {
		return AuditEntry{}, err
	}
	entry.Scope, entry.Key, entry.Actor, entry.Reason = c.Scope, c.Key, c.Actor, c.Reason
	var refusal error
	err = pgx.BeginFunc(ctx, access.Pool(store), func(tx pgx.Tx) error {
		q := access.Table(store)(tx)
		row, err := q.IdempotencyKeyGetForUpdate(ctx, keydb.IdempotencyKeyGetForUpdateParams{Scope: scope, IdempotencyKey: c.Key})
		if errors.Is(err, pgx.ErrNoRows) {
			entry.PreviousState, refusal = stateAbsent, ErrKeyNotFound
			return refusal
		}
		if err != nil {
			return pgstore.Translate(fmt.Errorf("lock the key: %w", err))
		}
		if entry.Action == ActionRelease {
			sum := sha256.Sum256(row.ResponseBody)
			entry.BodySHA256 = hex.EncodeToString(sum[:])
		}
		// The database's clock judges the lease, as it will for every
		// holder: no operator's clock frees a key still running.
		// A response in pieces is stored with the held status for
		// releases that know no pieces: read as the store reads it, it is
		// an outcome, which neither a resolve nor a release changes.
		resp, err := access.Response(row.ResponseStatus, row.ResponseHeaders, row.ResponseBody, row.ResponsePieces, row.ResponseSize)
		if err != nil {
			return fmt.Errorf("keyadmin: %w", err)
		}
		held, isHeld := idempotency.ParseHeld(resp, row.Now)
		if row.Status != "completed" || !isHeld {
			entry.PreviousState = row.Status
			refusal = fmt.Errorf("%w (status %d)", ErrNotHeld, resp.Status)
			return refusal
		}
		entry.PreviousState = heldStatus(held.State)
		if held.State == idempotency.HeldRunning {
			refusal = fmt.Errorf("%w until %s", ErrStillRunning, held.Until.UTC().Format(time.RFC3339))
			return refusal
		}
		// The audit row first, then the change: either failing rolls back
		// both.
		entry.Outcome = OutcomeDone
		if err := insertEntry(ctx, q, scope, &entry); err != nil {
			return err
		}
		changed, err := apply(tx, idempotency.Ref{Scope: c.Scope, Key: c.Key, ClaimedAt: row.CreatedAt})
		if err != nil {
			return err
		}
		if !changed { // the row is locked: unreachable unless it was changed under the lock
			return errors.New("keyadmin: the locked key's row changed nothing")
		}
		return nil
	})
	if refusal == nil {
		if err != nil {
			return AuditEntry{}, err
		}
		return entry, nil
	}
	entry.Outcome, entry.Refusal = OutcomeRefused, refusal.Error()
	if err := insertEntry(ctx, access.Table(store)(access.Pool(store)), scope, &entry); err != nil {
		return AuditEntry{}, errors.Join(refusal, fmt.Errorf("keyadmin: log the refusal: %w", err))
	}
	return entry, refusal
}

// insertEntry writes entry to the audit trail and fills in what the
// database gave it.
func insertEntry(ctx context.Context, q *keydb.Queries, scope []byte, entry *AuditEntry) error {
	p := keydb.IdempotencyKeyAuditInsertParams{
		Actor: entry.Actor, Action: entry.Action, Scope: scope, IdempotencyKey: entry.Key, PreviousState: entry.PreviousState,
		Outcome: entry.Outcome, Refusal: entry.Refusal, Reason: entry.Reason,
	}
	if entry.Action == ActionResolve {
		p.ResponseStatus = pgtype.Int4{Int32: int32(entry.ResponseStatus), Valid: true}
	}
	if entry.BodySHA256 != "" {
		p.BodySha256, _ = hex.DecodeString(entry.BodySHA256)
	}
	row, err := q.IdempotencyKeyAuditInsert(ctx, p)
	if err != nil {
		return pgstore.Translate(fmt.Errorf("keyadmin: write the audit row: %w", err))
	}
	entry.ID, entry.At, entry.DatabaseUser = row.ID, row.At, row.DatabaseUser
	return nil
}

// AuditFilter narrows Audit. Every field set must match.
type AuditFilter struct {
	// Scope keeps the rows of this scope; ScopePrefix and ScopeSuffix
	// those whose scope starts or ends with it (for an application that
	// joins its own parts into scopes).
	Scope, ScopePrefix, ScopeSuffix string
	Key                             string
	// Since keeps the rows written at or after it.
	Since time.Time
	// Limit bounds the list (0: 100).
	Limit int
}

// Audit returns the audit trail's rows that f keeps, newest first.
func Audit(ctx context.Context, store *pgstore.Store, f AuditFilter) ([]AuditEntry, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := access.Table(store)(access.Pool(store)).IdempotencyKeyAuditList(ctx, keydb.IdempotencyKeyAuditListParams{
		Scope: sent(store, f.Scope), ScopePrefix: sent(store, f.ScopePrefix), ScopeSuffix: sent(store, f.ScopeSuffix),
		IdempotencyKey: f.Key, Since: f.Since, MaxRows: int32(min(f.Limit, math.MaxInt32)),
	})
	if err != nil {
		return nil, pgstore.Translate(fmt.Errorf("keyadmin: read the audit trail: %w", err))
	}
	out := make([]AuditEntry, 0, len(rows))
	for _, r := range rows {
		e := AuditEntry{
			ID: r.ID, At: r.At, Actor: r.Actor, DatabaseUser: r.DatabaseUser, Action: r.Action,
			Scope: access.ScopeRead(store, r.Scope), Key: r.IdempotencyKey, PreviousState: r.PreviousState,
			Outcome: r.Outcome, Refusal: r.Refusal, Reason: r.Reason, ResponseStatus: int(r.ResponseStatus.Int32),
		}
		if r.BodySha256 != nil {
			e.BodySHA256 = hex.EncodeToString(r.BodySha256)
		}
		out = append(out, e)
	}
	return out, nil
}

// sent is a scope (or part of one) as the audit trail keeps it: as the key
// table's statements are sent it. Only a whole scope is converted (a
// UUID's 16 bytes to its text); a part is kept as it is.
func sent(store *pgstore.Store, scope string) []byte {
	b, _ := access.ScopeArg(store, scope)
	if b == nil {
		return []byte{} // nil is sent as NULL, which matches nothing
	}
	return b
}
