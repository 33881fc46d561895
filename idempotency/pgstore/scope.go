package pgstore

import (
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ScopeType is the SQL type of the key table's scope column, chosen when
// Migrate creates the table. bytea (the default) holds any scope. uuid
// holds a scope that is a UUID, so that on a database sharded by tenant
// (Citus) the key table can be distributed by the same uuid value as the
// tables it guards, and a claim lands on the shard of its tenant's rows.
// text holds a scope that is valid UTF-8 without NUL.
type ScopeType string

const (
	// ScopeBytea holds a scope as its bytes, whatever they are.
	ScopeBytea ScopeType = "bytea"
	// ScopeUUID holds a scope that is a UUID: its 16 bytes (as
	// github.com/google/uuid.UUID's, say) or its 36-character text form.
	// Both name the same key; the operator's reads (package keyadmin) give
	// the 16 bytes.
	ScopeUUID ScopeType = "uuid"
	// ScopeText holds a scope that is valid UTF-8 without NUL.
	ScopeText ScopeType = "text"
)

func (o Options) scope() (ScopeType, error) {
	switch o.Scope {
	case "":
		return ScopeBytea, nil
	case ScopeBytea, ScopeUUID, ScopeText:
		return o.Scope, nil
	}
	return "", fmt.Errorf("pgstore: scope type %q is none of bytea, uuid and text", o.Scope)
}

// scopeColumn is the scope column as the first migration declares it (and
// the pieces table's, 0005), and as it declares it for each type.
const scopeColumn = "scope            bytea       NOT NULL CHECK (length(scope) <= 255),"

func (t ScopeType) column() string {
	switch t {
	case ScopeUUID:
		return "scope            uuid        NOT NULL,"
	case ScopeText:
		return "scope            text        NOT NULL CHECK (length(scope) <= 255),"
	}
	return scopeColumn
}

// sql rewrites a key table statement for the scope column's type. The
// statements spell a scope's casts in three ways of their own (see
// internal/keydb/idempotency_keys.sql), each a no-op on bytea: a scope
// sent as the column holds it, scopes as sent, and a scope read back. On
// uuid and text columns pgstore sends scopes as text, cast to uuid where
// the column is uuid, and reads them back as text.
func (t ScopeType) sql(sql string) string {
	if t == ScopeBytea {
		return sql
	}
	stored := " AS text)"
	if t == ScopeUUID {
		stored = " AS text)::uuid"
	}
	sql = strings.ReplaceAll(sql, " AS bytea[])", " AS text[])")
	sql = strings.ReplaceAll(sql, " AS bytea)", stored)
	return strings.ReplaceAll(sql, "::bytea AS scope", "::text AS scope")
}

// check refuses a scope that the column cannot hold, before anything is
// sent.
func (t ScopeType) check(scope string) error {
	switch t {
	case ScopeUUID:
		if len(scope) != 16 && !uuidText(scope) {
			return fmt.Errorf("pgstore: the key table's scopes are uuid, and %q is neither a UUID's 16 bytes nor its text form", scope)
		}
	case ScopeText:
		if !utf8.ValidString(scope) || strings.IndexByte(scope, 0) >= 0 {
			return fmt.Errorf("pgstore: the key table's scopes are text, and %q is not UTF-8 without NUL", scope)
		}
	}
	return nil
}

// arg is scope as pgstore sends it (see sql).
func (t ScopeType) arg(scope string) []byte { return []byte(t.sent(scope)) }

// sent is scope as pgstore sends it, and as a statement reads it back (see
// sql): the scope itself for bytea and text, and for uuid its lower-case
// text form, so that a UUID's bytes and its text name one key. A scope
// that check refuses is sent as it is, for PostgreSQL to refuse.
func (t ScopeType) sent(scope string) string {
	switch {
	case t != ScopeUUID:
		return scope
	case len(scope) == 16:
		b := make([]byte, 36)
		hex.Encode(b[0:8], []byte(scope[0:4]))
		hex.Encode(b[9:13], []byte(scope[4:6]))
		hex.Encode(b[14:18], []byte(scope[6:8]))
		hex.Encode(b[19:23], []byte(scope[8:10]))
		hex.Encode(b[24:36], []byte(scope[10:16]))
		b[8], b[13], b[18], b[23] = '-', '-', '-', '-'
		return string(b)
	}
	return strings.ToLower(scope)
}

// read is a scope as a statement reads it back (see sql): the 16 bytes of
// a uuid column's text form, or the bytes themselves.
func (t ScopeType) read(b []byte) string {
	if t != ScopeUUID || !uuidText(string(b)) {
		return string(b)
	}
	out := make([]byte, 16)
	_, _ = hex.Decode(out, []byte(strings.ReplaceAll(string(b), "-", "")))
	return string(out)
}

// uuidText reports whether s is a UUID's text form: 36 characters, hex
// digits in groups of 8, 4, 4, 4 and 12 between hyphens.
func uuidText(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9') && !('a' <= c && c <= 'f') && !('A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
