package frontdoor_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
)

// A gateway in front of a Stripe-shaped API answers a key reused with
// another request as the IETF draft says (422), in the API's own error
// shape, which Stripe's SDKs raise as an idempotency error.
func Example() {
	tmpl, err := frontdoor.ParseTemplate([]byte(`{"error": {"type": "idempotency_error", "code": "{code}", "message": "{detail}"}}`))
	if err != nil {
		panic(err)
	}
	writeError := frontdoor.Writer(frontdoor.IETF, tmpl, "")

	w := httptest.NewRecorder()
	writeError(w, httptest.NewRequest("POST", "/v1/charges", nil), idempotency.ErrKeyMismatch)
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	fmt.Println(w.Body.String()[:60])
	// Output:
	// 422 application/json
	// {"error": {"type": "idempotency_error", "code": "idempotency
}
