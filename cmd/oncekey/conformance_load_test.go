package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// `oncekey conformance` on a document with a $ref to another document,
// which it does not follow: it says so on standard error, with where the
// $ref is (JSON pointer and line), and what it did instead, and the run
// goes on with the rest of the document: the check it was asked for runs
// and passes.
func TestConformanceReportsAnExternalRefAndGoesOn(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../openapi.yaml")
	require.NoError(t, err)
	doc := string(b)
	const key = "- $ref: '#/components/parameters/IdempotencyKey'\n"
	create := strings.Index(doc, "operationId: createOrder")
	require.Positive(t, create, "openapi.yaml has createOrder")
	at := create + strings.Index(doc[create:], key)
	require.Greater(t, at, create, "createOrder takes the key through a $ref")
	indent := doc[strings.LastIndexByte(doc[:at], '\n')+1 : at]
	const external = "common.yaml#/components/parameters/Trace"
	doc = doc[:at+len(key)] + indent + "- $ref: '" + external + "'\n" + doc[at+len(key):]
	line := strings.Count(doc[:at+len(key)], "\n") + 1
	spec := filepath.Join(t.TempDir(), "openapi.yaml")
	require.NoError(t, os.WriteFile(spec, []byte(doc), 0o600))

	addr, _ := startServe(t, map[string]string{})
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{
		"conformance", "--spec", spec, "--overrides", "../../api/conformance.yaml", "--url", "http://" + addr,
		"--auth", "Bearer " + DemoAPIKey, "--only", "replay,POST /orders", "--format", "json",
	}, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Contains(t, stderr.String(),
		`oncekey conformance: unsupported: an external $ref to "`+external+`" (only $refs within the document are followed) at /paths/~1orders/post/parameters/1 (line `+
			strconv.Itoa(line)+`): the parameter is left out`+"\n")

	var report struct {
		Summary struct{ Passed, Failed int }
		Results []struct{ Check, Operation, Status string }
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), stdout.String())
	require.Equal(t, 1, report.Summary.Passed, "the run went on: %s", stdout.String())
	require.Equal(t, "POST /orders", report.Results[0].Operation)
}
