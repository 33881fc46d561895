package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

var gadgetPath = regexp.MustCompile(`^/gadgets/SN-[0-9]+/activate$`)

// gadgets serves testdata/gadgets.yaml: gadget SN-1 exists, and no
// operation makes another.
func gadgets(t *testing.T) http.Handler {
	t.Helper()
	mux, handle := engineMux(t, "gadgets.yaml", func(r *http.Request, body []byte) error {
		var v map[string]any
		if !gadgetPath.MatchString(r.URL.Path) || json.Unmarshal(body, &v) != nil || (v["mode"] != "eco" && v["mode"] != "turbo") || len(v) != 1 {
			return fmt.Errorf("%w: %s %s", errInvalidRequest, r.URL.Path, body)
		}
		return nil
	})
	handle("POST /gadgets/{serial}/activate", func(w http.ResponseWriter, r *http.Request) {
		slow(r)
		if r.PathValue("serial") != "SN-1" {
			notFoundProblem(w, "gadget")
			return
		}
		var v map[string]any
		_ = json.NewDecoder(r.Body).Decode(&v)
		answerJSON(w, http.StatusOK, "", map[string]any{"serial": "SN-1", "mode": v["mode"]})
	})
	return mux
}

// A run that can make no working request, because only the user knows a
// gadget that exists, errs on every check of the operation and fails none;
// the starter file WriteOverrides writes for it has a blank for the
// serial, and, with the blank filled in, the same checks run and pass.
func TestWriteOverridesTurnsErrorsIntoRuns(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(gadgets(t))
	t.Cleanup(srv.Close)
	cfg := conformance.Config{Spec: loadSpec(t, "gadgets.yaml"), BaseURL: srv.URL, Auth: "Bearer a", Auth2: "Bearer b"}
	results, err := conformance.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Empty(t, byStatus(results, conformance.Fail), reasons(results))
	for _, r := range results {
		if r.Operation != "" && r.Status != conformance.Skip {
			require.Equal(t, conformance.Error, r.Status, "%s: %s", r.Check, r.Reason)
			require.Equal(t, "POST /gadgets/{serial}/activate", r.NeedsOverride, r.Check)
		}
	}

	var file bytes.Buffer
	n, err := conformance.WriteOverrides(&file, cfg, results)
	require.NoError(t, err)
	require.Equal(t, 1, n, "one operation needs an entry")
	require.Contains(t, file.String(), `      "serial": ""  # fill in: the spec's example named nothing that works`, file.String())
	require.Contains(t, file.String(), `    body: {"mode":"eco"}  # example: the spec's example; every field is sent as written`, file.String())
	require.Contains(t, file.String(), "# no working request could be made: POST /gadgets/SN-0/activate was refused (404 ", file.String())

	filled := strings.Replace(file.String(), `"serial": ""`, `"serial": "SN-1"`, 1)
	cfg.Overrides, err = conformance.ParseOverrides([]byte(filled))
	require.NoError(t, err, filled)
	results, err = conformance.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Empty(t, byStatus(results, conformance.Fail), reasons(results))
	require.Empty(t, byStatus(results, conformance.Error), reasons(results))
	for _, r := range results {
		if r.Check == "replay" || r.Check == "concurrent-once" || r.Check == "credential-isolation" || r.Check == "validation-not-stored" {
			require.Equal(t, conformance.Pass, r.Status, "%s: %s", r.Check, r.Reason)
		}
	}
}

// A run with nothing to fill in writes a file that says so, and that reads
// as an overrides file.
func TestWriteOverridesWithNothingToFillIn(t *testing.T) {
	t.Parallel()
	var file bytes.Buffer
	n, err := conformance.WriteOverrides(&file, conformance.Config{Spec: loadSpec(t, "gadgets.yaml")}, nil)
	require.NoError(t, err)
	require.Zero(t, n)
	o, err := conformance.ParseOverrides(file.Bytes())
	require.NoError(t, err, file.String())
	require.Empty(t, o.Operations)
}

// An operation without an operationId is named by its method and path
// alone, as the starter file names it, and the file reads back.
func TestOverridesOfAnOperationWithoutID(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/gadgets.yaml")
	require.NoError(t, err)
	doc, err := openapi3.NewLoader().LoadFromData(bytes.Replace(b, []byte("operationId: activateGadget"), nil, 1))
	require.NoError(t, err)
	o, err := conformance.ParseOverrides([]byte(`
operations:
  "POST /gadgets/{serial}/activate":
    path: {"serial": "SN-1"}
`))
	require.NoError(t, err)
	plans, err := conformance.Plan(conformance.Config{Spec: doc, Overrides: o})
	require.NoError(t, err)
	require.Len(t, plans, 1)
	require.Equal(t, "POST /gadgets/SN-1/activate application/json {\"mode\":\"eco\"}", plans[0].Request)
}
