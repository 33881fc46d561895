package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestIdempotencyKeyValidation(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})

		requireProblem(t, b.postOrder(t, "", seedBody), problem.MissingIdempotencyKey, "no Idempotency-Key header")
		requireProblem(t, b.postOrder(t, strings.Repeat("k", 256), seedBody), problem.InvalidIdempotencyKey, "256-byte key")
		requireProblem(t, b.postOrder(t, "a\tb", seedBody), problem.InvalidIdempotencyKey, "key with a tab inside")
		requireProblem(t, b.postOrder(t, "first", seedBody, "Idempotency-Key", "second"), problem.InvalidIdempotencyKey, "two Idempotency-Key headers")
		require.Zero(t, b.orderCount(t), "rejected keys must not run the operation")

		// 255 bytes using every printable ASCII character, space and
		// quotes included; the ends are not spaces, which HTTP would trim.
		var sb strings.Builder
		sb.WriteByte('<')
		for i := 0; sb.Len() < 254; i++ {
			sb.WriteByte(byte(0x20 + i%(0x7f-0x20)))
		}
		sb.WriteByte('>')
		longest := sb.String()
		require.Len(t, longest, 255)

		first := b.postOrder(t, longest, seedBody)
		requireFresh(t, first, "255-byte printable key")
		require.Equal(t, longest, first.Header.Get("Idempotency-Key"), "the key must be echoed exactly")
		requireReplayOf(t, first, b.postOrder(t, longest, seedBody), "255-byte key again")
		require.Equal(t, 1, b.orderCount(t))
	})
}

func TestRejectedRequestsConsumeNoKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{cfg: httpapi.Config{MaxBodyBytes: 1024}})
		const key = "rejected-then-fixed"
		send := func(body string, header ...string) reply {
			return b.do(t, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(body), append([]string{"Idempotency-Key", key}, header...)...))
		}

		requireProblem(t, send(`{"items":[],"amount":1200,"currency":"RUB"}`), problem.Validation, "empty items")
		requireProblem(t, send(`{"items":`), problem.MalformedJSON, "truncated JSON")
		requireProblem(t, send(seedBody, "Content-Type", "", "Content-Type", "text/plain"), problem.UnsupportedMediaType, "text/plain body")
		requireProblem(t, send(seedBody, "Content-Type", ""), problem.UnsupportedMediaType, "body without Content-Type")
		requireProblem(t, send(seedBody, "Authorization", ""), problem.Unauthorized, "no Authorization")
		requireProblem(t, send(seedBody, "Authorization", "", "Authorization", "Bearer ok_unknown"), problem.Unauthorized, "unknown API key")
		requireProblem(t, send(seedBody+strings.Repeat(" ", 1024)), problem.PayloadTooLarge, "body over the limit")
		requireProblem(t, send(`{"amount":1,"amount":1200,"items":[{"sku":"SKU-1","qty":2}],"currency":"RUB"}`), problem.MalformedJSON, "duplicate JSON keys")
		require.Zero(t, b.orderCount(t), "rejected requests must not run the operation")

		requireFresh(t, send(seedBody), "the valid request after all rejections")
		require.Equal(t, 1, b.orderCount(t))
	})
}

// streamed hides the concrete reader type from net/http, which then cannot
// know the length and sends the body chunked.
type streamed struct{ io.Reader }

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{cfg: httpapi.Config{MaxBodyBytes: 1024}})
		big := seedBody + strings.Repeat(" ", 2048-len(seedBody))

		sized := b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(big), "Idempotency-Key", "sized")
		require.Equal(t, int64(2048), sized.ContentLength)
		requireProblem(t, b.do(t, sized), problem.PayloadTooLarge, "2 KiB body with Content-Length")

		chunked := b.newRequest(t, http.MethodPost, "/orders", streamed{strings.NewReader(big)}, "Idempotency-Key", "chunked")
		require.Zero(t, chunked.ContentLength, "the body must be sent without a Content-Length")
		requireProblem(t, b.do(t, chunked), problem.PayloadTooLarge, "2 KiB chunked body")

		require.Zero(t, b.orderCount(t))
	})
}

// The default body limit fits the largest body the contract allows, an
// order of 100 items with the longest SKUs and largest quantities, and
// refuses a megabyte, which a caller could otherwise make the server read
// and canonicalise (128 such requests at once took it to 2.8 GB).
func TestDefaultBodyLimitFitsTheContract(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	items := make([]string, 100)
	for i := range items {
		items[i] = fmt.Sprintf(`{"sku":"%s","qty":1000000}`, fmt.Sprintf("%064d", i))
	}
	largest := `{"items":[` + strings.Join(items, ",") + `],"amount":1000000000000000,"currency":"RUB"}`
	requireFresh(t, b.postOrder(t, uuid.NewString(), largest), fmt.Sprintf("the largest valid order (%d bytes)", len(largest)))
	require.Less(t, len(largest)*4, int(httpapi.DefaultMaxBodyBytes), "the limit leaves room for whitespace")

	// Just under the old default of 1 MiB.
	megabyte := `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB","pad":"` + strings.Repeat("x", 1<<20-1000) + `"}`
	requireProblem(t, b.postOrder(t, uuid.NewString(), megabyte), problem.PayloadTooLarge, "almost a megabyte")
}

func TestBodyValidation(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})

		for _, c := range []struct {
			name, body, mentions string
		}{
			{"amount not an integer", `{"items":[{"sku":"SKU-1","qty":2}],"amount":"x","currency":"RUB"}`, "/amount"},
			{"qty zero", `{"items":[{"sku":"SKU-1","qty":0}],"amount":1200,"currency":"RUB"}`, "/items/0/qty"},
			{"lower-case currency", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"rub"}`, "/currency"},
			{"additional property", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB","note":"hi"}`, "note"},
			{"items missing", `{"amount":1200,"currency":"RUB"}`, "items"},
		} {
			r := b.postOrder(t, "validation-"+c.name, c.body)
			d := requireProblem(t, r, problem.Validation, c.name)
			require.Less(t, len(d.Detail), 200, "%s: the detail must be short, not a schema dump: %q", c.name, d.Detail)
			require.Contains(t, d.Detail, c.mentions, "%s: the detail must say where the problem is", c.name)
		}
		require.Zero(t, b.orderCount(t))
	})
}

// The body's schema is checked by the front door before the idempotency
// protocol looks at the key, so before a key mismatch is answered: a body
// against the schema gets the same 400 whether its key is new or used, and
// consumes no key. Both claim paths: orders defer the claim to the commit,
// bonus credits claim in a transaction first.
func TestBodySchemaCheckedBeforeTheKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, path   string
		valid, other string // two valid bodies
		invalid      string
		status       int
	}{
		{name: "order (deferred claim)", path: "/orders", valid: seedBody,
			other:   `{"items":[{"sku":"SKU-2","qty":1}],"amount":900,"currency":"RUB"}`,
			invalid: `{"items":[],"amount":1200,"currency":"RUB"}`, status: http.StatusCreated},
		{name: "bonus credit (transactional claim)", path: "/bonus/credits", valid: bonusBody(100, "welcome"),
			other: bonusBody(200, "welcome"), invalid: bonusBody(0, "welcome"), status: http.StatusCreated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, be backendCase) {
				b := setup(t, be.open(t), options{})
				key := "schema-" + tt.path
				requireProblem(t, b.postBonus(t, tt.path, key, tt.invalid), problem.Validation, "a body against the schema")
				first := b.postBonus(t, tt.path, key, tt.valid)
				require.Equal(t, tt.status, first.Status, "the valid body under the same key: %s", first)
				require.Empty(t, first.Header.Get("Idempotent-Replayed"), "the valid body must run")
				requireReplayOf(t, first, b.postBonus(t, tt.path, key, tt.valid), "the valid body again")
				requireProblem(t, b.postBonus(t, tt.path, key, tt.invalid), problem.Validation, "the invalid body under the used key")
				requireProblem(t, b.postBonus(t, tt.path, key, tt.other), problem.KeyMismatch, "another valid body under the used key")
			})
		})
	}
}
