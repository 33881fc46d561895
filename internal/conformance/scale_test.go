package conformance

import (
	"fmt"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

// TestSessionScales builds the session of a document of 40,000 operations
// made in memory (no parsing), and of one of 4,000: what newSession does
// per operation must cost the same however many there are, so ten times
// the operations take about ten times as long. Linear, the large one takes
// about half a second (a second under -race); a step that looks at every
// operation for each one, as finding each operation's GET once did, took
// 53 seconds, a hundred times the small one's. The bound is a ratio of two
// builds in one run, not a time, so that a busy machine slows both.
func TestSessionScales(t *testing.T) {
	t.Parallel()
	small, _ := buildSession(t, 2000)
	took, s := buildSession(t, 20000)
	t.Logf("sessions of 4000 and 40000 operations built in %v and %v (race: %v)", small.Round(time.Millisecond), took.Round(time.Millisecond), raceEnabled)
	require.Len(t, s.covered, 20000)
	for _, target := range s.covered {
		require.Equal(t, target.path+"/{id}", target.get, "the GET of what %s creates", target.name)
	}
	require.Less(t, took, 40*small+2*time.Second, "ten times the operations take about ten times as long, never a hundred")
}

// buildSession builds the session of a document of resources resources, a
// POST and a GET each, and returns how long newSession took.
func buildSession(t *testing.T, resources int) (time.Duration, *session) {
	t.Helper()
	key := &openapi3.ParameterRef{Value: openapi3.NewHeaderParameter("Idempotency-Key").WithSchema(openapi3.NewStringSchema())}
	body := &openapi3.RequestBodyRef{Value: openapi3.NewRequestBody().WithJSONSchema(
		openapi3.NewObjectSchema().WithProperty("amount", openapi3.NewIntegerSchema()).WithRequired([]string{"amount"}))}
	ok := openapi3.NewResponses(openapi3.WithStatus(200, &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("OK")}))
	paths := openapi3.NewPaths()
	for i := range resources {
		many, one := fmt.Sprintf("/v1/r%d", i), fmt.Sprintf("/v1/r%d/{id}", i)
		paths.Set(many, &openapi3.PathItem{Post: &openapi3.Operation{
			OperationID: fmt.Sprintf("create%d", i), Parameters: openapi3.Parameters{key}, RequestBody: body, Responses: ok,
		}})
		paths.Set(one, &openapi3.PathItem{
			Parameters: openapi3.Parameters{{Value: openapi3.NewPathParameter("id").WithSchema(openapi3.NewStringSchema())}},
			Get:        &openapi3.Operation{OperationID: fmt.Sprintf("get%d", i), Responses: ok},
		})
	}
	doc := &openapi3.T{OpenAPI: "3.1.0", Info: &openapi3.Info{Title: "Scales", Version: "1"}, Paths: paths}

	start := time.Now()
	s, err := newSession(Config{Spec: doc, BaseURL: "http://127.0.0.1:1"})
	took := time.Since(start)
	require.NoError(t, err)
	return took, s
}
