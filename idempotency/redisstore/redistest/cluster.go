package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Cluster is a Redis Cluster of a test's own on loopback: masters with
// one replica each, every node a redis-server process the test may kill.
type Cluster struct {
	// URL names every node as a seed (redis+cluster://…).
	URL   string
	Nodes []*Node
}

// Node is one redis-server of a Cluster.
type Node struct {
	Addr   string
	cmd    *exec.Cmd
	killed bool
}

// Kill kills the node with SIGKILL, as a crash would.
func (n *Node) Kill() {
	n.killed = true
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
}

// Client is a plain client of this one node.
func (n *Node) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// StartCluster starts masters*2 redis-server processes with cluster
// mode on, makes them a cluster of masters with one replica each
// (redis-cli --cluster create), and waits until every node says the
// cluster is ok.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli must be installed (Debian package redis-tools): %v", err)
	}
	dir := t.TempDir()
	c := &Cluster{}
	var addrs []string
	for i := range masters * 2 {
		port := clusterPort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", fmt.Sprintf("%s/nodes-%d.conf", dir, i),
			"--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no", "--dir", dir)
		require.NoError(t, cmd.Start(), "redis-server must be installed")
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT) // a paused node dies too
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		c.Nodes = append(c.Nodes, &Node{Addr: addr, cmd: cmd})
		addrs = append(addrs, addr)
		waitListening(t, addr, "redis-server")
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	out, err := exec.Command("redis-cli", append(args, "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	require.NoError(t, err, "redis-cli --cluster create: %s", out)
	c.URL = "redis+cluster://" + strings.Join(addrs, ",")
	c.WaitOK(t, 20*time.Second)
	return c
}

// WaitOK waits until every node still running says cluster_state:ok and
// knows of masters serving all 16384 slots.
func (c *Cluster) WaitOK(t testing.TB, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, n := range c.Nodes {
			if n.killed {
				continue
			}
			node := redis.NewClient(&redis.Options{Addr: n.Addr})
			info, err := node.ClusterInfo(context.Background()).Result()
			_ = node.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				return false
			}
		}
		return true
	}, within, 50*time.Millisecond, "the Redis Cluster did not become ok")
}

// clusterPort is a free loopback port whose cluster bus port (port+10000)
// is free too.
func clusterPort(t testing.TB) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		_ = bus.Close()
		return port
	}
	t.Fatal("no free port pair for a Redis Cluster node")
	return 0
}
