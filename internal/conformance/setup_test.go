package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// runAgainst runs every check on the operations only names against h, with
// the credentials and overrides given.
func runAgainst(t *testing.T, h http.Handler, auth, auth2, overrides string, only ...string) []conformance.Result {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	o, err := conformance.ParseOverrides([]byte(overrides))
	require.NoError(t, err)
	results, err := conformance.Run(context.Background(), conformance.Config{
		Spec: loadSpec(t, "widgets.yaml"), BaseURL: srv.URL, Auth: auth, Auth2: auth2, Overrides: o, Only: only,
		RetentionWait: toyRetention,
	})
	require.NoError(t, err)
	return results
}

// notFoundFirst answers 404 to every paint before it looks at the key, as
// a router or a middleware that loads the resource does.
func notFoundFirst(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/paint") {
			problem(w, http.StatusNotFound, "no such widget")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// noSuchWidget names a widget the toy does not have.
const noSuchWidget = paintTriggers + `
    path: {id: 7e0b9c52-3d1e-4c1a-9f2b-5a6d7e8f9a0b}
`

// paintTriggers give paint's fail and large requests, so that every check
// of the operation runs (and errs) rather than skip for want of them.
const paintTriggers = `
operations:
  paintWidget:
    fail: {header: {X-Fail: "1"}}
    large: {header: {X-Large: "1"}}`

// The overrides name a widget the API does not have (404), or the API
// refuses to paint any widget (404 before the key), or the tool is given a
// credential the API refuses (401): no check of the operation can test its promise, so each is an
// error that says what the tool needs, not a failure, and the reports
// show errors as errors.
func TestChecksThatCannotRunAreErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, auth string
		h          http.Handler
		overrides  string
		reason     []string // what every error says
	}{
		{"no such resource, found after the key", "Bearer a", newToy(bugs{}), noSuchWidget,
			[]string{"(404 ", "its path parameters must name resources that exist"}},
		{"no such resource, found before the key", "Bearer a", notFoundFirst(newToy(bugs{})), paintTriggers,
			[]string{"(404 ", "its path parameters must name resources that exist"}},
		{"the credential refused", "Bearer nobody", newToy(bugs{}), paintTriggers,
			[]string{"the credential (--auth) was refused (401 ", "give --auth"}},
	}
	perOperation := 0
	for _, c := range conformance.Checks() {
		if c.ID != "response-valid" && c.ID != "retry-after" {
			perOperation++
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			results := runAgainst(t, tt.h, tt.auth, "Bearer b", tt.overrides, "paintWidget")
			require.Empty(t, byStatus(results, conformance.Fail), reasons(results))
			errored := 0
			for _, r := range results {
				if r.Operation == "" {
					continue // the checks of the whole run read what answers there were
				}
				require.Equal(t, conformance.Error, r.Status, "%s: %s", r.Check, r.Reason)
				require.Contains(t, r.Reason, "no working request could be made: ", r.Check)
				for _, want := range tt.reason {
					require.Contains(t, r.Reason, want, r.Check)
				}
				errored++
			}
			require.Equal(t, perOperation, errored, "every check of the operation ran")
			sum := conformance.Summarize(results)
			require.Equal(t, errored, sum.Errors)

			var junit bytes.Buffer
			require.NoError(t, conformance.Write(&junit, "junit", conformance.Profiles["oncekey"], results))
			var report struct {
				Suites []struct {
					Tests    int `xml:"tests,attr"`
					Failures int `xml:"failures,attr"`
					Errors   int `xml:"errors,attr"`
					Cases    []struct {
						Name    string    `xml:"name,attr"`
						Failure *struct{} `xml:"failure"`
						Error   *struct {
							Message string `xml:"message,attr"`
							Text    string `xml:",chardata"`
						} `xml:"error"`
					} `xml:"testcase"`
				} `xml:"testsuite"`
			}
			require.NoError(t, xml.Unmarshal(junit.Bytes(), &report), junit.String())
			require.Len(t, report.Suites, 1)
			suite := report.Suites[0]
			require.Equal(t, errored, suite.Errors, "the testsuite's errors")
			require.Zero(t, suite.Failures)
			withError := 0
			for _, c := range suite.Cases {
				require.Nil(t, c.Failure, c.Name)
				if c.Error != nil {
					withError++
					require.Contains(t, c.Error.Message, "no working request could be made", c.Name)
					require.NotEmpty(t, c.Error.Text, c.Name)
				}
			}
			require.Equal(t, errored, withError, "an <error> per errored case")

			var js bytes.Buffer
			require.NoError(t, conformance.Write(&js, "json", conformance.Profiles["oncekey"], results))
			var doc struct {
				Summary struct{ Errors, Failed int }
				Results []struct{ Check, Operation, Status string }
			}
			require.NoError(t, json.Unmarshal(js.Bytes(), &doc), js.String())
			require.Equal(t, errored, doc.Summary.Errors)
			for _, r := range doc.Results {
				if r.Operation != "" {
					require.Equal(t, "error", r.Status, r.Check)
				}
			}

			var text bytes.Buffer
			require.NoError(t, conformance.Write(&text, "text", conformance.Profiles["oncekey"], results))
			require.Regexp(t, `(?m)^error +key-required +POST /widgets/\{id\}/paint +no working request could be made: `, text.String())
			require.True(t, strings.HasSuffix(text.String(), fmt.Sprintf("%d passed, 0 failed, %d skipped, %d errors\n", sum.Passed, sum.Skipped, errored)), text.String())
		})
	}
}

// A second credential refused whatever the key is an error of
// credential-isolation alone; one refused only under the first's key is a
// failure (TestChecksFailWhenTheyShould, "refuses another caller's key").
func TestASecondCredentialRefusedIsAnError(t *testing.T) {
	t.Parallel()
	results := runAgainst(t, newToy(bugs{}), "Bearer a", "Bearer nobody", toyOverrides, "createWidget")
	require.Empty(t, byStatus(results, conformance.Fail), reasons(results))
	require.Equal(t, []string{"credential-isolation"}, byStatus(results, conformance.Error), reasons(results))
	for _, r := range results {
		if r.Status == conformance.Error {
			require.Contains(t, r.Reason, "the second credential (--auth2) was refused under a new key too (401 ")
		}
	}
}
