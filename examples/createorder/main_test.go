package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

func TestCreateOrder(t *testing.T) {
	t.Parallel()
	svc := servicetest.Start(t, memory.New(), servicetest.Options{})
	env := map[string]string{"ONCEKEY_URL": svc.URL, "ONCEKEY_API_KEY": svc.APIKey}
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), func(k string) string { return env[k] }, &out))
	require.Regexp(t, `^created order [0-9a-f-]{36} created\n$`, out.String())
}

// Without its variables the example says which ones to set.
func TestCreateOrderNamesItsVariables(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{{}, {"ONCEKEY_URL": "http://127.0.0.1:1"}, {"ONCEKEY_API_KEY": "ok_local_demo"}} {
		err := run(t.Context(), func(k string) string { return env[k] }, &bytes.Buffer{})
		require.ErrorIs(t, err, errNoServer, "env %v", env)
		require.ErrorContains(t, err, "ONCEKEY_URL")
		require.ErrorContains(t, err, "ONCEKEY_API_KEY")
	}
}
