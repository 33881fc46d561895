//go:build image

// The container image's test, which make test/image runs (go test -tags
// image): it builds the image with make image, as a user would, which takes
// a container engine and a build of the binary of its own (CGO_ENABLED=0,
// -trimpath: some two minutes with a cold build cache, seconds after), so
// go test ./... (make test/service) leaves it out and make test runs it
// once, as a step of its own.
package container_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// engine runs podman or docker, whichever works, with the flags this kind
// of machine needs; make image builds with it too.
const engine = "./engine.sh"

// maxOverhead is what the image may hold beyond its binary: the CA bundle,
// passwd and group, and the layers' metadata.
const maxOverhead = 2 << 20

// TestImage builds the image (make image, under a tag of its own, removed
// afterwards) and holds what docs/operations.md says of it: it is the
// static, stripped binary, a CA bundle and a non-root user, no more than
// maxOverhead beyond the binary; serve in it migrates a fresh PostgreSQL
// database and answers /readyz; proxy in it runs a covered POST upstream
// once and replays it; and each exits 0 on SIGTERM, the binary being the
// container's PID 1. Without a working podman or docker it is skipped,
// unless CI is set.
func TestImage(t *testing.T) {
	t.Parallel()
	if out, err := exec.Command(engine, "--which").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no container engine: %s", out)
		}
		t.Fatalf("CI is set, and no container engine works: %s", out)
	}
	image := build(t)

	t.Run("contents", func(t *testing.T) {
		t.Parallel()
		var config struct {
			User       string
			Env        []string
			Entrypoint []string
			Labels     map[string]string
		}
		require.NoError(t, json.Unmarshal([]byte(engineOutput(t, "image", "inspect", "--format", "{{json .Config}}", image)), &config))
		uid, gid, ok := strings.Cut(config.User, ":")
		require.True(t, ok, "the image's user is uid:gid, numeric, so that a runtime checking for non-root (runAsNonRoot) needs no passwd: %q", config.User)
		for _, id := range []string{uid, gid} {
			n, err := strconv.Atoi(id)
			require.NoError(t, err, "the image's user is numeric: %q", config.User)
			require.NotZero(t, n, "the image runs as a user other than root: %q", config.User)
		}
		require.Equal(t, []string{"/usr/local/bin/oncekey"}, config.Entrypoint, "IMAGE serve runs oncekey serve")
		require.Contains(t, config.Env, "ONCEKEY_ADDR=:8080", "serve and proxy listen where a published port reaches them")
		require.Equal(t, "Apache-2.0", config.Labels["org.opencontainers.image.licenses"])
		require.Equal(t, "https://github.com/oncekey/oncekey", config.Labels["org.opencontainers.image.source"])
		require.NotEmpty(t, config.Labels["org.opencontainers.image.version"])

		files := exportFiles(t, image)
		binary := files["usr/local/bin/oncekey"]
		require.NotEmpty(t, binary, "the image holds the binary")
		size, err := strconv.ParseInt(engineOutput(t, "image", "inspect", "--format", "{{.Size}}", image), 10, 64)
		require.NoError(t, err)
		t.Logf("image %d bytes, its binary %d (%+d)", size, len(binary), size-int64(len(binary)))
		require.LessOrEqual(t, size, int64(len(binary))+maxOverhead, "the image is at most its binary and %d bytes", maxOverhead)

		require.ElementsMatch(t, []string{"etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt", "usr/local/bin/oncekey"}, slices.Collect(maps.Keys(files)),
			"the image holds these files and nothing else (no base image)")
		require.Contains(t, strings.Split(string(files["etc/passwd"]), "\n"), "oncekey:x:"+uid+":"+gid+":oncekey:/:/sbin/nologin", "passwd names the image's user")
		require.Contains(t, strings.Split(string(files["etc/group"]), "\n"), "oncekey:x:"+gid+":", "group names the image's group")

		var certs int
		for rest := files["etc/ssl/certs/ca-certificates.crt"]; ; certs++ {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				break
			}
			_, err := x509.ParseCertificate(block.Bytes)
			require.NoError(t, err, "certificate %d of the CA bundle", certs+1)
		}
		require.Greater(t, certs, 10, "the CA bundle holds the machine's certificate authorities")

		exe, err := elf.NewFile(bytes.NewReader(binary))
		require.NoError(t, err, "the entrypoint is an ELF binary")
		for _, p := range exe.Progs {
			require.NotEqual(t, elf.PT_INTERP, p.Type, "the binary is static: it names no dynamic loader, which the image does not hold")
		}
		for _, s := range exe.Sections {
			require.NotEqual(t, ".symtab", s.Name, "the binary is stripped of its symbol table (-ldflags=-s)")
			require.False(t, strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_"), "the binary is stripped of DWARF (-ldflags=-w): %s", s.Name)
		}
		// -ldflags is not recorded under -trimpath: the sections say it.
		info, err := buildinfo.Read(bytes.NewReader(binary))
		require.NoError(t, err, "the binary's build information")
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		require.Equal(t, "0", settings["CGO_ENABLED"], "built with CGO_ENABLED=0: %v", settings)
		require.Equal(t, "true", settings["-trimpath"], "built with -trimpath: %v", settings)
	})

	t.Run("serve", func(t *testing.T) {
		t.Parallel()
		url, pool := testdb.Empty(t)
		addr := freeAddr(t)
		c := startContainer(t, image, []string{"-e", "DATABASE_URL=" + testdb.PoolURL(url, 4)}, "serve", "--addr", addr)
		c.awaitOK(t, "http://"+addr+"/readyz")
		var orders bool
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT to_regclass('orders') IS NOT NULL").Scan(&orders))
		require.True(t, orders, "serve in the container migrated the empty database")
		c.stop(t)
	})

	t.Run("proxy", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int64
		upstream := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"ch_%d_%s","path":%q}`, n, rand.Text(), r.URL.Path)
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go func() { _ = upstream.Serve(ln) }()
		t.Cleanup(func() { _ = upstream.Close() })

		// The routes file, mounted read-only, readable by the image's user.
		config := t.TempDir()
		require.NoError(t, os.Chmod(config, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(config, "routes.yaml"), []byte("routes:\n  - method: POST\n    path: /charges\n"), 0o644))

		url, pool := testdb.Empty(t)
		addrs := freeAddrs(t, 2)
		addr, metrics := addrs[0], addrs[1]
		c := startContainer(t, image, []string{"-e", "DATABASE_URL=" + testdb.PoolURL(url, 4), "-v", config + ":/config:ro"},
			"proxy", "--upstream", "http://"+ln.Addr().String(), "--routes", "/config/routes.yaml", "--scope-header", "X-Account-Id",
			"--addr", addr, "--metrics-addr", metrics)
		c.awaitOK(t, "http://"+metrics+"/readyz")

		key := rand.Text()
		var bodies [2][]byte
		var replayed [2]string
		for i := range bodies {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/charges", strings.NewReader(`{"amount":500,"currency":"EUR"}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Account-Id", "acme")
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err, "POST %d through the proxy", i+1)
			bodies[i], err = io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode, "POST %d: %s", i+1, bodies[i])
			replayed[i] = resp.Header.Get("Idempotent-Replayed")
		}
		require.Equal(t, int64(1), runs.Load(), "the upstream ran the POST once")
		require.Equal(t, [2]string{"", "true"}, replayed, "the second answer is a replay")
		require.Equal(t, string(bodies[0]), string(bodies[1]), "the replay is the first answer's bytes")
		var stored []byte
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT response_body FROM idempotency_keys WHERE idempotency_key = $1", key).Scan(&stored))
		require.Equal(t, string(bodies[0]), string(stored), "the proxy in the container keeps its keys in PostgreSQL")
		c.stop(t)
	})
}

// build runs make image under a tag of its own, so that no other run's
// build is tested, and removes the image when the test ends.
func build(t *testing.T) string {
	t.Helper()
	image := "localhost/oncekey:test-" + strings.ToLower(rand.Text()[:12])
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // a cold build of the binary included
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "IMAGE="+image)
	cmd.Dir = "../.."
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() {
		if out, err := exec.Command(engine, "image", "rm", image).CombinedOutput(); err != nil {
			t.Logf("remove %s: %v: %s", image, err, out)
		}
	})
	require.NoError(t, err, "make image IMAGE=%s:\n%s", image, out)
	t.Logf("make image IMAGE=%s: %s", image, time.Since(start).Round(time.Millisecond))
	return image
}

// engineOutput runs the engine with args and returns what it printed,
// trimmed.
func engineOutput(t *testing.T, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), engine, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s %s: %s", engine, strings.Join(args, " "), stderr.String())
	return strings.TrimSpace(string(out))
}

// exportFiles returns the regular files of image's file system by their
// paths: those of a container created from it (never started), exported.
func exportFiles(t *testing.T, image string) map[string][]byte {
	t.Helper()
	name := "oncekey-test-" + strings.ToLower(rand.Text()[:12])
	engineOutput(t, "create", "--name", name, image)
	t.Cleanup(func() { _ = exec.Command(engine, "rm", "-f", name).Run() })
	var stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), engine, "export", name)
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	files := map[string][]byte{}
	archive := tar.NewReader(out)
	for {
		h, err := archive.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "read the export")
		if h.Typeflag != tar.TypeDir {
			files[strings.TrimPrefix(h.Name, "/")], err = io.ReadAll(archive)
			require.NoError(t, err, "read %s from the export", h.Name)
		}
	}
	require.NoError(t, cmd.Wait(), "%s export: %s", engine, stderr.String())
	return files
}

// container is an engine's run of the image, attached: its output is the
// test's, shown if the test fails, and its exit is the container's.
type container struct {
	name   string
	cmd    *exec.Cmd
	output *servicetest.SyncBuffer
	done   chan struct{}
}

// startContainer runs image with args on the host's network (the loopback
// ports of the test, PostgreSQL and the upstream), with the engine's
// options opts, and removes it when the test ends.
func startContainer(t *testing.T, image string, opts []string, args ...string) *container {
	t.Helper()
	c := &container{name: "oncekey-test-" + strings.ToLower(rand.Text()[:12]), output: &servicetest.SyncBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(engine, slices.Concat([]string{"run", "--rm", "--name", c.name, "--network=host"}, opts, []string{image}, args)...)
	c.cmd.Stdout, c.cmd.Stderr = c.output, c.output
	require.NoError(t, c.cmd.Start())
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = exec.Command(engine, "rm", "-f", c.name).Run()
			<-c.done
		}
		if t.Failed() {
			t.Logf("%s %s:\n%s", image, strings.Join(args, " "), c.output.String())
		}
	})
	return c
}

// awaitOK waits until url answers 200, for a minute at most; a container
// that exits meanwhile fails at once.
func (c *container) awaitOK(t *testing.T, url string) {
	t.Helper()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-c.done:
			t.Fatalf("the container exited (%v) before %s answered 200", c.cmd.ProcessState, url)
		case <-deadline:
			t.Fatalf("%s did not answer 200 within a minute", url)
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM to the engine's client, which passes it on to the
// container's PID 1, the binary: it must drain and exit 0 within its
// shutdown timeout.
func (c *container) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		t.Fatal("the container did not exit within a minute of SIGTERM")
	}
	require.Equal(t, 0, c.cmd.ProcessState.ExitCode(), "the container's exit on SIGTERM")
}

// freeAddr is a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// freeAddrs is n distinct free loopback addresses. Every listener stays open
// until all n are chosen: closed one at a time, the kernel may hand the same
// port out twice, and a server given two equal addresses cannot start.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}
