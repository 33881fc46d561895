package problem_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	rec.Header().Set("Retry-After", "1")
	problem.Write(rec, problem.Unavailable, "try later")

	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
	require.Equal(t, "1", rec.Header().Get("Retry-After"), "headers set before Write are kept")
	var got problem.Details
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Equal(t, problem.Details{
		Type: "https://oncekey.dev/problems/unavailable", Title: problem.Unavailable.Title,
		Status: http.StatusServiceUnavailable, Detail: "try later",
	}, got)
}
