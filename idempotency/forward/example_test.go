package forward_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/oncekey/oncekey/idempotency/forward"
)

// A reverse proxy forwards each request prepared, and its error handler
// asks whether the upstream may have run the request: if so, the key's
// outcome is unknown; if not, the key may be freed, and the client's retry
// run it.
func Example() {
	// An upstream that reads a request and dies before it answers.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		panic(http.ErrAbortHandler)
	}))
	target, _ := url.Parse(upstream.URL)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if forward.Reached(r, err) {
				fmt.Println("it may have run: its key's outcome is unknown")
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			fmt.Println("it never got there: free its key")
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	gateway := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxy.ServeHTTP(w, forward.Prepare(r))
	})
	send := func() {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		gateway.ServeHTTP(httptest.NewRecorder(), r)
	}

	send()
	upstream.Close() // now nothing listens
	send()
	// Output:
	// it may have run: its key's outcome is unknown
	// it never got there: free its key
}
