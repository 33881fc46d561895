package testdb

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Cluster is a throwaway PostgreSQL server of one test's own (initdb into a
// temporary directory, its own port on 127.0.0.1), for tests that stop and
// start the database under load. The shared server is never touched.
type Cluster struct {
	dir, port string
	bin       string
	asUser    []string // runs the server's commands as the postgres user when the test runs as root
}

// freePort is a free loopback port.
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: pick a port: %v", err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
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
	c := &Cluster{bin: filepath.Dir(bins[len(bins)-1]), port: freePort(t)}

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
	if out, err := c.run("pg_ctl", "-D", c.dir, "-o", opts, "-l", c.dir+".log", "-w", "start"); err != nil {
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
	cmd := exec.Command(argv[0], argv[1:]...)
	// In the cluster's own directory: run as the postgres user, the
	// commands may not enter the test's (a private temporary directory).
	cmd.Dir = filepath.Dir(c.dir)
	return cmd.CombinedOutput()
}

// Standby makes a synchronous standby of c: a base backup of c
// (pg_basebackup -R) on a port of its own, streaming from c, and c waiting
// for it at every commit (synchronous_standby_names = 'standby',
// synchronous_commit on: a commit is acknowledged once the standby has
// flushed its WAL). It returns once c reports the standby as sync.
func (c *Cluster) Standby(t testing.TB) *Cluster {
	t.Helper()
	s := &Cluster{bin: c.bin, asUser: c.asUser, port: freePort(t), dir: filepath.Join(filepath.Dir(c.dir), "standby")}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%s user=postgres application_name=standby", c.port)
	if out, err := s.run("pg_basebackup", "-D", s.dir, "-d", conninfo, "-R", "-X", "stream", "--no-sync"); err != nil {
		t.Fatalf("testdb: pg_basebackup: %v\n%s", err, out)
	}
	s.Start(t)
	t.Cleanup(func() { _, _ = s.run("pg_ctl", "-D", s.dir, "-m", "immediate", "-w", "stop") })
	for _, sql := range []string{
		"ALTER SYSTEM SET synchronous_standby_names = 'standby'",
		"ALTER SYSTEM SET synchronous_commit = 'on'",
		"SELECT pg_reload_conf()",
	} {
		if out, err := c.psql(sql); err != nil {
			t.Fatalf("testdb: %s: %v\n%s", sql, err, out)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.psql("SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'")
		if err == nil && strings.TrimSpace(string(out)) == "sync" {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("testdb: the standby is not in sync after 30s: %v %s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill kills the server with SIGKILL, as a crash of its machine would look
// to its clients: connections cut, nothing shut down.
func (c *Cluster) Kill(t testing.TB) {
	t.Helper()
	pidFile, err := os.ReadFile(filepath.Join(c.dir, "postmaster.pid"))
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	if err != nil {
		t.Fatalf("testdb: postmaster.pid: %v", err)
	}
	// The postmaster and every process it started (backends, WAL sender,
	// writers): a backend outliving its postmaster would keep serving its
	// connection for a while.
	pids := []int{pid}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, stat := range stats {
		b, err := os.ReadFile(stat)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after ")".
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(stat)))
			pids = append(pids, child)
		}
	}
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && p == pid {
			t.Fatalf("testdb: kill the postmaster: %v", err)
		}
	}
}

// Promote makes a standby the primary (pg_ctl promote) and waits until it
// accepts writes.
func (c *Cluster) Promote(t testing.TB) {
	t.Helper()
	if out, err := c.run("pg_ctl", "-D", c.dir, "-w", "promote"); err != nil {
		t.Fatalf("testdb: promote: %v\n%s", err, out)
	}
}

// Port is the server's port.
func (c *Cluster) Port() string { return c.port }

func (c *Cluster) psql(sql string) ([]byte, error) {
	return c.run("psql", "-h", "127.0.0.1", "-p", c.port, "-U", "postgres", "-d", "postgres", "-Atc", sql)
}

// Exec runs sql on the server's maintenance database (psql).
func (c *Cluster) Exec(t testing.TB, sql string) string {
	t.Helper()
	out, err := c.psql(sql)
	if err != nil {
		t.Fatalf("testdb: %s: %v\n%s", sql, err, out)
	}
	return strings.TrimSpace(string(out))
}
