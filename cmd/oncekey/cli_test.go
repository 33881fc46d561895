package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite docs/cli.md from the commands' help")

// commands is every command path of the CLI, the root ("") first, in the
// order the help lists them.
func commands(t *testing.T) []string {
	t.Helper()
	var c cli
	k, err := parser(&c, func(string) string { return "" }, io.Discard, io.Discard)
	require.NoError(t, err)
	paths := []string{""}
	var walk func(n *kong.Node, prefix string)
	walk = func(n *kong.Node, prefix string) {
		for _, child := range n.Children {
			if child.Hidden {
				continue
			}
			path := strings.TrimSpace(prefix + " " + child.Name)
			paths = append(paths, path)
			walk(child, path)
		}
	}
	walk(k.Model.Node, "")
	return paths
}

// trap is a loopback listener that counts the connections made to it.
type trap struct {
	ln    net.Listener
	dials atomic.Int64
}

func newTrap(t *testing.T) *trap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tr := &trap{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			tr.dials.Add(1)
			conn.Close()
		}
	}()
	return tr
}

// TestHelpHasNoSideEffects runs every command's --help (and -h, and `help
// COMMAND`; plain `oncekey` is TestNoCommandIsAUsageError's) as a process
// of its own, with every address (the database, Redis, the API's and the
// internal listeners) pointing at one occupied port that counts
// connections: each exits 0 at once with its usage, and nothing connected
// to the database or Redis, nor tried to listen (serve would have failed
// on the occupied address).
func TestHelpHasNoSideEffects(t *testing.T) {
	t.Parallel()
	tr := newTrap(t)
	addr := tr.ln.Addr().String()
	env := []string{
		subprocessEnv + "=cli",
		"DATABASE_URL=postgres://postgres@" + addr + "/postgres?connect_timeout=1",
		"REDIS_URL=redis://" + addr + "/0",
		"ONCEKEY_ADDR=" + addr, "ONCEKEY_PPROF_ADDR=" + addr, "ONCEKEY_PROVIDER_URL=http://" + addr,
	}
	var invocations [][]string
	for _, path := range commands(t) {
		words := strings.Fields(path)
		invocations = append(invocations, append(words[:len(words):len(words)], "--help"))
		invocations = append(invocations, append(words[:len(words):len(words)], "-h"))
		invocations = append(invocations, append([]string{"help"}, words...))
	}
	for _, args := range invocations {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
			cmd.Env = append(os.Environ(), env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			err := cmd.Run()
			require.NoError(t, err, "exit status; stderr:\n%s", stderr.String())
			require.Less(t, time.Since(start), 10*time.Second, "help must not wait for anything")
			require.True(t, strings.HasPrefix(stdout.String(), "Usage: oncekey"), "usage on stdout:\n%s", stdout.String())
			require.Empty(t, stderr.String(), "nothing on stderr")
		})
	}
	t.Cleanup(func() {
		require.Zero(t, tr.dials.Load(), "--help connected to the database, Redis or the provider")
	})
}

// A group's help lists its commands.
func TestGroupHelpListsItsCommands(t *testing.T) {
	t.Parallel()
	for group, subs := range map[string][]string{"keys": {"inspect", "stats", "stuck"}, "accounts": {"create", "revoke-key"}} {
		out, err := runCommand(t, nil, group, "--help")
		require.NoError(t, err)
		for _, sub := range subs {
			require.Contains(t, out, group+" "+sub, "%s --help", group)
		}
	}
}

// TestCLIReference keeps docs/cli.md, the help of every command, in step
// with the commands; `make docs/cli` rewrites it (go test -update).
func TestCLIReference(t *testing.T) {
	// Not parallel: COLUMNS decides the width kong wraps to, and the
	// reference is written at 80 columns whatever the terminal.
	t.Setenv("COLUMNS", "80")
	var doc strings.Builder
	doc.WriteString("# Command line reference\n\n" +
		"<!-- Generated from the commands' --help by `make docs/cli`; `make test` fails when it is stale. -->\n\n" +
		"Every setting is a flag and an environment variable (named in its help); a flag\n" +
		"given on the command line wins over its variable. `oncekey help COMMAND` is\n" +
		"`oncekey COMMAND --help`; plain `oncekey` prints the usage to standard error\n" +
		"and exits 2. Every bad value (of a flag or a variable) is reported in one run,\n" +
		"one line each, together with what the command checks of its settings, and\n" +
		"nothing runs.\n")
	for _, path := range commands(t) {
		out, err := runCommand(t, nil, append(strings.Fields(path), "--help")...)
		require.NoError(t, err, "%s --help", path)
		fmt.Fprintf(&doc, "\n## %s\n\n```text\n%s```\n", strings.TrimSpace("oncekey "+path), out)
	}
	file := filepath.Join("..", "..", "docs", "cli.md")
	if *update {
		require.NoError(t, os.WriteFile(file, []byte(doc.String()), 0o644))
	}
	committed, err := os.ReadFile(file)
	require.NoError(t, err, "run make docs/cli")
	require.Equal(t, doc.String(), string(committed), "docs/cli.md is stale: run make docs/cli")
}

// builtOncekey builds cmd/oncekey as `make build` does, once per test
// binary, and returns the binary's path.
var builtOncekey = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "oncekey-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "oncekey")
	out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
})

// TestVersion: a binary built from this checkout names its module version
// and the commit it was built from.
func TestVersion(t *testing.T) {
	t.Parallel()
	bin, err := builtOncekey()
	require.NoError(t, err)
	out, err := exec.Command(bin, "version").Output()
	require.NoError(t, err)
	require.Regexp(t, `^oncekey \S+ `, string(out))
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		// Not a git checkout (an unpacked archive): nothing to stamp.
		require.Contains(t, string(out), "no VCS revision")
		return
	}
	require.Contains(t, string(out), " revision "+strings.TrimSpace(string(head)))
}

// Every flag with a variable is named after it, so that one can be guessed
// from the other: ONCEKEY_MAX_CONNS is --max-conns, IDEMPOTENCY_TTL --ttl.
func TestFlagsAreNamedAfterTheirVariables(t *testing.T) {
	t.Parallel()
	var c cli
	k, err := parser(&c, func(string) string { return "" }, io.Discard, io.Discard)
	require.NoError(t, err)
	seen := 0
	require.NoError(t, kong.Visit(k.Model, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok {
			if v := f.Tag.Get("envvar"); v != "" {
				seen++
				require.Equal(t, flagOf(v), f.Name, "the flag of %s", v)
			}
		}
		return next(nil)
	}))
	require.Positive(t, seen)
}

// flagOf is the name of the flag of the environment variable v.
func flagOf(v string) string {
	v = strings.TrimPrefix(strings.TrimPrefix(v, "ONCEKEY_"), "IDEMPOTENCY_")
	return strings.ToLower(strings.ReplaceAll(v, "_", "-"))
}
