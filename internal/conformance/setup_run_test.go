package conformance_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// Run probes the base URL before any check: when nothing answers HTTP
// there it returns a SetupError and no result; any answer at all, a 500
// included, lets the checks run. The probe is one GET of the base URL,
// without the credential. Plan sends nothing, so a dead URL does not stop
// it; --only naming nothing the document has is a SetupError too.
func TestRunProbesTheURL(t *testing.T) {
	t.Parallel()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	cfg := conformance.Config{Spec: transfersDoc(t, "bearer"), BaseURL: dead.URL, Auth: "Bearer first"}
	results, err := conformance.Run(context.Background(), cfg)
	var setup conformance.SetupError
	require.ErrorAs(t, err, &setup)
	require.ErrorContains(t, err, "nothing answers at "+dead.URL+": ")
	require.Empty(t, results)

	plans, err := conformance.Plan(cfg)
	require.NoError(t, err, "Plan sends nothing")
	require.NotEmpty(t, plans)

	only := cfg
	only.Only = []string{"no-such-check"}
	_, err = conformance.Plan(only)
	require.ErrorAs(t, err, &setup, "--only naming nothing")

	var mu sync.Mutex
	var probes []string // the Authorization of each request to the root
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			mu.Lock()
			probes = append(probes, r.Method+" "+r.Header.Get("Authorization"))
			mu.Unlock()
			http.Error(w, "down for maintenance", http.StatusInternalServerError)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg.BaseURL = srv.URL
	cfg.Only = []string{"replay"}
	results, err = conformance.Run(context.Background(), cfg)
	require.NoError(t, err, "a 500 is an answer")
	require.NotEmpty(t, results, "the checks ran")
	require.Equal(t, []string{"GET "}, probes, "one GET of the root, without the credential")
}
