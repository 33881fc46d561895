package testharness

import (
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/oncekey/oncekey/idempotency"
)

// Post sends h a POST /transfers of body under key, as the held
// operations' tests of several modules do, and returns its answer.
func Post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(body))
	req.Header.Set(idempotency.HeaderKey, key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
