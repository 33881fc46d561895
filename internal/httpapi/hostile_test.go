package httpapi_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/problem"
	"github.com/oncekey/oncekey/internal/store/memory"
)

// Every kind of malformed body gets a clear 4xx problem, runs nothing and
// consumes no key: the same key with a good body then runs the operation.
// docs/reliability.md points at this table.
func TestHostileBodies(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{cfg: httpapi.Config{MaxBodyBytes: 4096}})
		for _, tc := range []struct {
			name   string
			body   string
			header []string
			kind   problem.Kind
		}{
			{"invalid JSON", `{"items":[`, nil, problem.MalformedJSON},
			{"trailing garbage", seedBody + `x`, nil, problem.MalformedJSON},
			{"wrong type", `{"items":[{"sku":"SKU-1","qty":"two"}],"amount":1200,"currency":"RUB"}`, nil, problem.Validation},
			// No single meaning (beyond what a double holds exactly, nested
			// deeper than canonical JSON goes): malformed, as docs/problems.md
			// says, whatever the schema would have said.
			{"huge number", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1e400,"currency":"RUB"}`, nil, problem.MalformedJSON},
			{"amount beyond the contract", `{"items":[{"sku":"SKU-1","qty":2}],"amount":9000000000000000,"currency":"RUB"}`, nil, problem.Validation},
			{"deep nesting", `{"items":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, nil, problem.MalformedJSON},
			{"duplicate JSON keys", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"amount":1,"currency":"RUB"}`, nil, problem.MalformedJSON},
			{"non-UTF-8", "{\"items\":[{\"sku\":\"SKU-\xff\",\"qty\":2}],\"amount\":1200,\"currency\":\"RUB\"}", nil, problem.MalformedJSON},
			{"empty body", ``, nil, problem.Validation},
			{"JSON null", `null`, nil, problem.Validation},
			{"wrong Content-Type", seedBody, []string{"Content-Type", "text/plain"}, problem.UnsupportedMediaType},
			{"over the size limit", `{"items":[{"sku":"` + strings.Repeat("S", 8192) + `","qty":2}],"amount":1200,"currency":"RUB"}`, nil, problem.PayloadTooLarge},
		} {
			key := uuid.NewString()
			header := append([]string{"Idempotency-Key", key}, tc.header...)
			requireProblem(t, b.do(t, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(tc.body), header...)), tc.kind, tc.name)
			requireFresh(t, b.postOrder(t, key, seedBody), tc.name+": then the same key with a good body")
		}
	})
}
