package testdb

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// Cluster is a throwaway PostgreSQL server of one test's own (initdb into a
// temporary directory, its own port on 127.0.0.1), for tests that stop and
// start the database under load. The shared server is never touched.
type Cluster struct {
	dir, port string
	bin       string
	asUser    []string // runs the server's commands as the postgres user when the test runs as root
}

// NewCluster initialises and starts a cluster, and stops it when the test
// ends. It fails the test (skips it outside CI) when the PostgreSQL server
// binaries are not installed.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("testdb: PostgreSQL's initdb is required in CI")
		}
		t.Skip("testdb: no initdb under /usr/lib/postgresql")
	}
	c := &Cluster{bin: filepath.Dir(bins[len(bins)-1])}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: pick a port: %v", err)
	}
	c.port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_ = ln.Close()

	root, err := os.MkdirTemp("", "oncekey-cluster-")
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	c.dir = filepath.Join(root, "data")
	if os.Geteuid() == 0 {
		// initdb refuses to run as root.
		pg, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testdb: running as root needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatalf("testdb: %v", err)
		}
		c.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	if out, err := c.run("initdb", "-D", c.dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"); err != nil {
		t.Fatalf("testdb: initdb: %v\n%s", err, out)
	}
	c.Start(t)
	t.Cleanup(func() { _, _ = c.run("pg_ctl", "-D", c.dir, "-m", "immediate", "-w", "stop") })
	return c
}

// URL is the cluster's maintenance database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", c.port)
}

// Start starts the server and waits until it accepts connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	opts := fmt.Sprintf("-p %s -c listen_addresses=127.0.0.1 -k %s -c fsync=off", c.port, filepath.Dir(c.dir))
	if out, err := c.run("pg_ctl", "-D", c.dir, "-o", opts, "-l", filepath.Join(filepath.Dir(c.dir), "log"), "-w", "start"); err != nil {
		t.Fatalf("testdb: start cluster: %v\n%s", err, out)
	}
}

// Stop stops the server at once, as a crash would: every connection is cut
// and uncommitted transactions are lost.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if out, err := c.run("pg_ctl", "-D", c.dir, "-m", "immediate", "-w", "stop"); err != nil {
		t.Fatalf("testdb: stop cluster: %v\n%s", err, out)
	}
}

func (c *Cluster) run(name string, args ...string) ([]byte, error) {
	argv := append(append([]string(nil), c.asUser...), append([]string{filepath.Join(c.bin, name)}, args...)...)
	return exec.Command(argv[0], argv[1:]...).CombinedOutput()
}
