// Package redistest runs a real redis-server for a test, on a random
// 127.0.0.1 port, with no persistence.
//
// Without a redis-server binary on PATH the test is skipped with a message,
// unless INFLIGHT_REQUIRE_REDIS is set (as CI sets it), when it fails.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv, when set, turns a missing redis-server into a test failure.
const RequireEnv = "INFLIGHT_REQUIRE_REDIS"

// Server is a running redis-server.
type Server struct {
	Addr string
	t    testing.TB
	bin  string
	port int
	args []string // beyond the defaults
	cmd  *exec.Cmd
	exit chan struct{}
}

// Start starts a redis-server, stopped at the test's cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t)
}

func start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("redis-server not found, and %s is set: %v", RequireEnv, err)
		}
		t.Skipf("redis-server not found (install it, e.g. apt-get install redis-server): %v", err)
	}
	s := &Server{t: t, bin: bin, port: freePort(t), args: args}
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Restart starts the server again on the same port, empty, after Kill; it
// returns once the server answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning")
	s.cmd.Args = append(s.cmd.Args, s.args...)
	s.cmd.Dir = s.t.TempDir()
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	s.exit = make(chan struct{})
	go func(cmd *exec.Cmd, exit chan struct{}) {
		_ = cmd.Wait()
		close(exit)
	}(s.cmd, s.exit)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-s.exit:
			s.t.Fatalf("redistest: redis-server exited at start: %v", s.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: redis-server at %s not answering: %v", s.Addr, err)
		}
		time.Sleep(5 * time.Millisecond) // a process starting: poll its port
	}
}

// Kill stops the server at once (SIGKILL), as a crash would, and waits for
// it to exit. Its data is lost.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
}

// Client returns a client for the server with the timeouts the fleet
// package recommends, closed at the test's cleanup.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr,
		DialTimeout:           250 * time.Millisecond,
		ReadTimeout:           250 * time.Millisecond,
		WriteTimeout:          250 * time.Millisecond,
		ContextTimeoutEnabled: true,
		MaxRetries:            1,
		PoolSize:              64,
		Protocol:              2, // RESP3 makes the client check for push notifications before each call
	})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// String returns the server's address.
func (s *Server) String() string { return fmt.Sprintf("redis-server at %s", s.Addr) }

// Cluster is a Redis Cluster of redis-servers, one master per shard and no
// replicas, its hash slots split evenly between them.
type Cluster struct {
	Nodes []*Server
	t     testing.TB
}

// StartCluster starts a cluster of n masters (at least 1), stopped at the
// test's cleanup, and returns once every node reports the cluster healthy.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	cl := &Cluster{t: t}
	for range n {
		// The node's config file goes in its working directory, a fresh
		// temporary one.
		cl.Nodes = append(cl.Nodes, start(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"))
	}
	ctx := context.Background()
	const slots = 16384
	for i, s := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := c.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			t.Fatalf("redistest: cluster addslotsrange %d-%d on %s: %v", lo, hi, s.Addr, err)
		}
		if i > 0 {
			if err := c.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(cl.Nodes[0].port)).Err(); err != nil {
				t.Fatalf("redistest: cluster meet: %v", err)
			}
		}
		c.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster not healthy on %s: %v %s", s.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond) // nodes gossiping: poll their state
		}
		c.Close()
	}
	return cl
}

// Client returns a cluster client with the timeouts the fleet package
// recommends, closed at the test's cleanup.
func (cl *Cluster) Client() *redis.ClusterClient {
	addrs := make([]string, len(cl.Nodes))
	for i, s := range cl.Nodes {
		addrs[i] = s.Addr
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 addrs,
		DialTimeout:           250 * time.Millisecond,
		ReadTimeout:           250 * time.Millisecond,
		WriteTimeout:          250 * time.Millisecond,
		ContextTimeoutEnabled: true,
		MaxRetries:            1,
		Protocol:              2,
	})
	cl.t.Cleanup(func() { c.Close() })
	return c
}
