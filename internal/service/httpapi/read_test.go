package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestGetOrder(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		created := requireFresh(t, b.postOrder(t, "get-me", seedBody), "create")

		got, err := b.client.GetOrderWithResponse(context.Background(), created.Id, nil)
		require.NoError(t, err, "GET /orders/%s", created.Id)
		require.Equal(t, http.StatusOK, got.StatusCode(), "GET /orders/%s: %s", created.Id, got.Body)
		o := *got.JSON200
		require.Equal(t, created.Id, o.Id)
		require.Equal(t, created.Status, o.Status)
		require.Equal(t, created.Amount, o.Amount)
		require.Equal(t, created.Currency, o.Currency)
		require.Equal(t, created.Items, o.Items)
		require.True(t, created.CreatedAt.Equal(o.CreatedAt), "created_at: 201 said %s, GET says %s", created.CreatedAt, o.CreatedAt)

		requireProblem(t, b.get(t, "/orders/"+uuid.NewString()), problem.NotFound, "unknown uuid")
		requireProblem(t, b.get(t, "/orders/not-a-uuid"), problem.Validation, "id that is not a uuid")
		upper := b.get(t, "/orders/"+strings.ToUpper(o.Id))
		require.Equal(t, http.StatusOK, upper.Status, "an id in upper case is the same id: %s", upper)
		require.Equal(t, o.Id, decodeOrder(t, upper).Id)
	})
}

func TestListOrdersPages(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		var want []string
		for i := range 5 {
			o := requireFresh(t, b.postOrder(t, fmt.Sprintf("list-%d", i), seedBody), fmt.Sprintf("order %d", i))
			want = append(want, o.Id)
		}
		slices.Reverse(want) // newest first

		var got []string
		cursor := ""
		for page := 1; ; page++ {
			q := url.Values{"limit": {"2"}}
			if cursor != "" {
				q.Set("cursor", cursor)
			}
			r := b.get(t, "/orders?"+q.Encode())
			require.Equal(t, http.StatusOK, r.Status, "page %d: %s", page, r)
			var p api.OrderPage
			require.NoError(t, json.Unmarshal(r.Body, &p), "page %d", page)
			require.LessOrEqual(t, len(p.Items), 2, "page %d exceeds the limit", page)
			for _, o := range p.Items {
				got = append(got, o.Id)
			}
			if p.NextCursor == nil {
				require.Equal(t, 3, page, "5 orders in pages of 2 end on page 3")
				require.Len(t, p.Items, 1, "the last page holds the fifth order")
				break
			}
			require.NotEmpty(t, *p.NextCursor, "page %d: empty next_cursor", page)
			require.Less(t, page, 3, "page %d: the last page must have no next_cursor", page)
			cursor = *p.NextCursor
		}
		require.Equal(t, want, got, "paging must list every order once, newest first")

		for _, c := range []struct{ query, mentions string }{
			{"cursor=garbage!", "cursor"},
			{"limit=0", "limit"},
			{"limit=101", "limit"},
			// A parameter that does not parse is a validation error, not
			// a body problem.
			{"limit=abc", "limit"},
		} {
			d := requireProblem(t, b.get(t, "/orders?"+c.query), problem.Validation, "GET /orders?"+c.query)
			require.Contains(t, d.Detail, c.mentions, "GET /orders?%s: the detail must name the parameter", c.query)
		}
	})
}
