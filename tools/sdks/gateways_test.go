package sdks_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// binDir holds the binaries the tests build: oncekey and Caddy with the
// idempotency module.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sdks-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	pgstoretest.Main(m, pgstoretest.Options{
		// The gateways migrate their own key tables; the tests hold no
		// connection of theirs.
		Open: func(ctx context.Context, url string) (*pgxpool.Pool, error) {
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				return nil, err
			}
			cfg.MaxConns = 1
			return pgxpool.NewWithConfig(ctx, cfg)
		},
		After: func() { _ = os.RemoveAll(binDir) },
	})
}

// build builds pkg in the module at dir, once per test binary, as a user
// would.
func build(dir, pkg, name string) func() (string, error) {
	return sync.OnceValues(func() (string, error) {
		bin := filepath.Join(binDir, name)
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s in %s: %w\n%s", pkg, dir, err, out)
		}
		return bin, nil
	})
}

var (
	buildOncekey = build(filepath.Join("..", ".."), "./cmd/oncekey", "oncekey")
	// buildCaddy builds what make test/caddy builds: the module's cmd/caddy.
	buildCaddy = build(filepath.Join("..", "..", "idempotency", "caddymodule"), "./cmd/caddy", "caddy")
)

// stripeTemplate is the error template docs/gateway.md gives for
// Stripe-shaped APIs: the gateway's own answers read as Stripe's errors of
// type idempotency_error.
var stripeTemplate = filepath.Join("..", "..", "deploy", "gateway", "stripe-error-template.json")

// duplicateWait is how long a duplicate of a charge in flight waits at the
// gateway for the first one's answer: half the SDKs' timeout in these
// tests, so that the gateway answers such a duplicate before the SDK gives
// up on it, as it does for every SDK whose timeout is longer than the
// gateway's wait (Stripe's: 80 s by default).
const duplicateWait = "500ms"

// mutations, from SDKS_MUTATION (comma-separated), misconfigure every
// gateway on purpose, to watch the suite fail: "profile-oncekey" gives them
// the service's answers (202 to a duplicate in flight, 409 to a reused
// key), which the SDKs take for a charge or retry; "no-template" leaves
// their own answers as problem documents, which Stripe's SDKs do not read
// as errors.
var mutations = strings.Split(os.Getenv("SDKS_MUTATION"), ",")

// gateway is a gateway process in front of the upstream, keys in a
// PostgreSQL database of its own.
type gateway struct {
	addr string
	bin  string
	args []string
	env  []string
	log  string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
}

func (g *gateway) url() string { return "http://" + g.addr }

// start runs the gateway and waits until it takes connections.
func (g *gateway) start(t *testing.T) {
	t.Helper()
	log, err := os.OpenFile(g.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(t, err)
	defer log.Close()
	cmd := exec.Command(g.bin, g.args...)
	cmd.Env = append(os.Environ(), g.env...)
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	g.cmd, g.exited = cmd, exited
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		conn, err := net.Dial("tcp", g.addr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}, 60*time.Second, 20*time.Millisecond, "%s did not listen on %s:\n%s", filepath.Base(g.bin), g.addr, g.logs())
	select {
	case <-exited:
		t.Fatalf("%s exited:\n%s", filepath.Base(g.bin), g.logs())
	default:
	}
}

// crash kills the gateway at once, as a crash or kill -9 would.
func (g *gateway) crash(t *testing.T) {
	t.Helper()
	require.NoError(t, g.cmd.Process.Kill())
	<-g.exited
}

func (g *gateway) logs() string {
	b, _ := os.ReadFile(g.log)
	return string(b)
}

// gatewayKind starts one kind of gateway in front of an upstream.
type gatewayKind struct {
	name  string
	start func(t *testing.T, upstream string) *gateway
}

var gatewayKinds = []gatewayKind{
	{"proxy", startProxy},
	{"caddy", startCaddy},
}

// keyDatabase is a database of the test's own for a gateway's keys, with a
// small pool: the machine's PostgreSQL serves other suites too.
func keyDatabase(t *testing.T) string {
	t.Helper()
	dbURL, _ := pgstoretest.Empty(t)
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return dbURL + sep + "pool_max_conns=3"
}

// startProxy runs oncekey proxy as docs/gateway.md shows it for a
// Stripe-shaped API: POST /v1/charges covered, keys scoped by the
// Authorization header (the API key), the gateway's own answers in Stripe's
// error shape.
func startProxy(t *testing.T, upstream string) *gateway {
	t.Helper()
	bin, err := buildOncekey()
	require.NoError(t, err)
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - method: POST\n    path: /v1/charges\n    wait: "+duplicateWait+"\n"), 0o600))
	g := &gateway{addr: freeAddr(t), bin: bin, log: filepath.Join(dir, "proxy.log")}
	g.args = []string{"proxy",
		"--upstream", upstream,
		"--routes", routes,
		"--scope-authorization", "--scope-secret", "sdk gateways' scope secret, 32 bytes",
		"--database-url", keyDatabase(t),
		"--addr", g.addr,
	}
	if !slices.Contains(mutations, "no-template") {
		g.args = append(g.args, "--error-template", stripeTemplate)
	}
	if slices.Contains(mutations, "profile-oncekey") {
		g.args = append(g.args, "--profile", "oncekey")
	}
	g.start(t)
	return g
}

// startCaddy runs Caddy with the module in front of the upstream, with the
// same settings as startProxy's.
func startCaddy(t *testing.T, upstream string) *gateway {
	t.Helper()
	bin, err := buildCaddy()
	require.NoError(t, err)
	dir := t.TempDir()
	template, err := filepath.Abs(stripeTemplate)
	require.NoError(t, err)
	var options string
	if !slices.Contains(mutations, "no-template") {
		options += fmt.Sprintf("\t\terror_template %q\n", template)
	}
	if slices.Contains(mutations, "profile-oncekey") {
		options += "\t\tprofile oncekey\n"
	}
	g := &gateway{addr: freeAddr(t), bin: bin, log: filepath.Join(dir, "caddy.log")}
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
}
http://%s {
	idempotency /v1/charges {
		scope {http.request.header.Authorization}
		scope_secret {env.IDEMPOTENCY_SCOPE_SECRET}
		database_url %q
		namespace charges
		wait %s
%s	}
	reverse_proxy %s
}
`, g.addr, keyDatabase(t), duplicateWait, options, strings.TrimPrefix(upstream, "http://"))
	file := filepath.Join(dir, "Caddyfile")
	require.NoError(t, os.WriteFile(file, []byte(caddyfile), 0o600))
	g.args = []string{"run", "--config", file, "--adapter", "caddyfile"}
	g.env = []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "IDEMPOTENCY_SCOPE_SECRET=" + strings.Repeat("s", 32)}
	g.start(t)
	return g
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}
