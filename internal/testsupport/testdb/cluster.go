package testdb

import (
	"errors"
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
	root      string   // the temporary directory it owns, if any
	asUser    []string // runs the server's commands as the postgres user when the test runs as root
	opts      []string // server settings (-c name=value) of every start
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
	c, err := newCluster(freePort(t))
	switch {
	case errors.Is(err, errNoServer) && os.Getenv("CI") == "":
		t.Skip("testdb: no initdb under /usr/lib/postgresql")
	case err != nil:
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(c.halt)
	return c
}

// errNoServer: the PostgreSQL server binaries are not installed.
var errNoServer = errors.New("PostgreSQL's initdb is required (apt-get install postgresql)")

// newCluster initialises and starts a cluster on port; the caller stops it
// (halt), and its directory goes with it.
func newCluster(port string) (*Cluster, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, errNoServer
	}
	c := &Cluster{bin: filepath.Dir(bins[len(bins)-1]), port: port}
	root, err := os.MkdirTemp("", "oncekey-cluster-")
	if err != nil {
		return nil, err
	}
	c.root = root
	c.dir = filepath.Join(root, "data")
	if os.Geteuid() == 0 {
		// initdb refuses to run as root.
		pg, err := user.Lookup("postgres")
		if err != nil {
			c.halt()
			return nil, fmt.Errorf("running as root needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			c.halt()
			return nil, err
		}
		c.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	if out, err := c.run("initdb", "-D", c.dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"); err != nil {
		c.halt()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := c.start(); err != nil {
		c.halt()
		return nil, err
	}
	return c, nil
}

// halt stops the server at once and removes its directory, if it is the
// cluster's own (a standby's lives in its primary's).
func (c *Cluster) halt() {
	_, _ = c.run("pg_ctl", "-D", c.dir, "-m", "immediate", "-w", "stop")
	if c.root != "" {
		_ = os.RemoveAll(c.root)
	}
}

// URL is the cluster's maintenance database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", c.port)
}

// Start starts the server and waits until it accepts connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	if err := c.start(); err != nil {
		t.Fatalf("testdb: %v", err)
	}
}

func (c *Cluster) start() error {
	opts := fmt.Sprintf("-p %s -c listen_addresses=127.0.0.1 -k %s -c fsync=off %s", c.port, filepath.Dir(c.dir), strings.Join(c.opts, " "))
	if out, err := c.run("pg_ctl", "-D", c.dir, "-o", opts, "-l", c.dir+".log", "-w", "start"); err != nil {
		return fmt.Errorf("start cluster: %w\n%s", err, out)
	}
	return nil
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
	s, err := c.replica(freePort(t), "standby", 0)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(s.halt)
	for _, sql := range []string{
		"ALTER SYSTEM SET synchronous_standby_names = 'standby'",
		"ALTER SYSTEM SET synchronous_commit = 'on'",
		"SELECT pg_reload_conf()",
	} {
		if out, err := c.psql(sql); err != nil {
			t.Fatalf("testdb: %s: %v\n%s", sql, err, out)
		}
	}
	if err := c.await("SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'", "sync"); err != nil {
		t.Fatalf("testdb: the standby is not in sync: %v", err)
	}
	return s
}

// Replica makes an asynchronous streaming replica of c, as most
// deployments' read replicas are, that applies each transaction delay
// after its commit on c (recovery_min_apply_delay; 0: at once). It
// returns once the replica streams from c.
func (c *Cluster) Replica(t testing.TB, delay time.Duration) *Cluster {
	t.Helper()
	r, err := c.replica(freePort(t), "", delay)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(r.halt)
	return r
}

// replica makes a streaming replica of c on port, named name in c's
// pg_stat_replication (default: after its port), applying WAL delay late.
func (c *Cluster) replica(port, name string, delay time.Duration) (*Cluster, error) {
	if name == "" {
		name = "replica_" + port
	}
	r := &Cluster{bin: c.bin, asUser: c.asUser, port: port, dir: filepath.Join(filepath.Dir(c.dir), name)}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%s user=postgres application_name=%s", c.port, name)
	if out, err := r.run("pg_basebackup", "-D", r.dir, "-d", conninfo, "-R", "-X", "stream", "--no-sync", "--checkpoint=fast"); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	if delay > 0 {
		r.opts = append(r.opts, fmt.Sprintf("-c recovery_min_apply_delay=%dms", delay.Milliseconds()))
	}
	if err := r.start(); err != nil {
		return nil, err
	}
	if err := c.await(fmt.Sprintf("SELECT state FROM pg_stat_replication WHERE application_name = '%s'", name), "streaming"); err != nil {
		r.halt()
		return nil, fmt.Errorf("the replica does not stream: %w", err)
	}
	return r, nil
}

// await runs query on c until it prints want, for up to 30s.
func (c *Cluster) await(query, want string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.psql(query)
		if err == nil && strings.TrimSpace(string(out)) == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: want %s after 30s, got %v %s", query, want, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CatchUp waits until the replica r has replayed everything its primary
// had written when CatchUp was called.
func (r *Cluster) CatchUp(t testing.TB, primary *Cluster) {
	t.Helper()
	lsn := primary.Exec(t, "SELECT pg_current_wal_lsn()")
	if err := r.await(fmt.Sprintf("SELECT pg_last_wal_replay_lsn() >= '%s'::pg_lsn", lsn), "t"); err != nil {
		t.Fatalf("testdb: the replica does not catch up: %v", err)
	}
}

// Freeze stops every process of the server (SIGSTOP): connections stay
// open and nothing answers, as a hung machine looks to its clients.
// Thaw (SIGCONT) lets it go on.
func (c *Cluster) Freeze(t testing.TB) { c.signal(t, syscall.SIGSTOP) }

// Thaw undoes Freeze.
func (c *Cluster) Thaw(t testing.TB) { c.signal(t, syscall.SIGCONT) }

// Kill kills the server with SIGKILL, as a crash of its machine would look
// to its clients: connections cut, nothing shut down.
func (c *Cluster) Kill(t testing.TB) { c.signal(t, syscall.SIGKILL) }

// signal sends sig to the postmaster and every process it started
// (backends, WAL sender and receiver, writers): a backend outliving a
// killed postmaster would keep serving its connection for a while.
func (c *Cluster) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	pidFile, err := os.ReadFile(filepath.Join(c.dir, "postmaster.pid"))
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	if err != nil {
		t.Fatalf("testdb: postmaster.pid: %v", err)
	}
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
		if err := syscall.Kill(p, sig); err != nil && p == pid {
			t.Fatalf("testdb: signal the postmaster: %v", err)
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
