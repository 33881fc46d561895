package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestOperationsEndpoints(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})

		health := b.get(t, "/healthz")
		require.Equal(t, http.StatusOK, health.Status, "GET /healthz: %s", health)
		require.JSONEq(t, `{"status":"ok"}`, string(health.Body), "GET /healthz body")

		ready := b.get(t, "/readyz")
		require.Equal(t, http.StatusOK, ready.Status, "GET /readyz: %s", ready)
		require.JSONEq(t, `{"status":"ok"}`, string(ready.Body), "GET /readyz body")

		spec := b.get(t, "/openapi.yaml")
		require.Equal(t, http.StatusOK, spec.Status, "GET /openapi.yaml: %d", spec.Status)
		require.Equal(t, "application/yaml", spec.Header.Get("Content-Type"))
		require.Equal(t, string(oncekey.OpenAPISpec), string(spec.Body), "GET /openapi.yaml must serve the embedded contract")

		requireProblem(t, b.get(t, "/nope"), problem.NotFound, "GET /nope")
		del := b.do(t, b.newRequest(t, http.MethodDelete, "/orders", nil))
		requireProblem(t, del, problem.MethodNotAllowed, "DELETE /orders")
		require.Equal(t, []string{"GET", "POST"}, del.Header.Values("Allow"), "a 405 lists the allowed methods")
	})
}

func TestNotReady(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		down := errors.New("database says no")
		b := setup(t, be.open(t), options{cfg: httpapi.Config{Ready: func(context.Context) error { return down }}})

		r := b.get(t, "/readyz")
		d := requireProblem(t, r, problem.Unavailable, "GET /readyz with a failing dependency")
		require.NotEmpty(t, r.Header.Get("Retry-After"), "503 needs Retry-After")
		require.NotContains(t, d.Detail, down.Error(), "the detail must not leak the dependency's error")

		health := b.get(t, "/healthz")
		require.Equal(t, http.StatusOK, health.Status, "liveness must not depend on readiness: %s", health)
	})
}
