// Package redistest runs a real redis-server for a test of code that uses
// package fleet (as net/http/httptest runs a server), on a random 127.0.0.1
// port, with no persistence; and the faults a test needs from it:
// a crash (Kill, then Restart, empty), a hang (Stop and Cont, SIGSTOP and
// SIGCONT), and a network cut between a client and the server (a Proxy).
//
// Without a redis-server binary on PATH the test is skipped with a message,
// unless INFLIGHT_REQUIRE_REDIS is set (as CI sets it), when it fails; a
// TestMain that calls ReportSkips says in one line which tests it skipped.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet/internal/netcut"
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
	conf string   // a config file to start with, if any
	cmd  *exec.Cmd
	exit chan struct{}
}

// Start starts a redis-server, stopped at the test's cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, Server{})
}

// start starts a redis-server as like says: on like.port (0: a free one),
// with like.conf (if any) and like.args beyond the defaults.
func start(t testing.TB, like Server) *Server {
	t.Helper()
	SkipWithoutRedis(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	s := &Server{t: t, bin: bin, port: like.port, args: like.args, conf: like.conf}
	t.Cleanup(s.Kill)
	// A port of its own choosing was free when freePort chose it, but
	// another process may take it before the server binds it (a client's
	// connection takes its port from the same range): then the server
	// exits at once, and starts again on another.
	for try := 1; ; try++ {
		if like.port == 0 {
			s.port = pickPort(t)
		}
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
		if s.launch() {
			return s
		}
		if like.port != 0 || try == 3 {
			t.Fatalf("redistest: redis-server exited at start: %v", s.cmd.ProcessState)
		}
	}
}

// freeClusterPort returns a free port for a cluster node: its cluster bus
// listens 10000 above it, so that port must be free too, and both must be
// valid (redis-server refuses a port above 55535 in cluster mode).
func freeClusterPort(t testing.TB) int {
	for range 100 {
		p := freePort(t)
		if p > 55535 {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		ln.Close()
		return p
	}
	t.Fatalf("redistest: no free port pair for a cluster node")
	return 0
}

// pickPort chooses a server's port (a test of the retries takes one that
// is not free).
var pickPort = freePort

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
	if !s.launch() {
		s.t.Fatalf("redistest: redis-server exited at start: %v", s.cmd.ProcessState)
	}
}

// launch starts the server on its port and waits until it answers: false
// if it exited first.
func (s *Server) launch() bool {
	s.t.Helper()
	var args []string
	if s.conf != "" {
		args = append(args, s.conf) // a config file goes first
	}
	args = append(args, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning")
	s.cmd = exec.Command(s.bin, append(args, s.args...)...)
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
			return true
		}
		select {
		case <-s.exit:
			return false
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

// Stop stops the server with SIGSTOP, as a host that hangs would: its
// connections stay open and calls to it wait, until Cont. Kill ends a
// stopped server too.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a server stopped by Stop (SIGCONT); it answers the calls
// that waited.
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatalf("redistest: %v to a server that is not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %v: %v", sig, err)
	}
}

// Client returns a client for the server with the timeouts the fleet
// package recommends, closed at the test's cleanup.
func (s *Server) Client() *redis.Client { return client(s.t, s.Addr) }

// ClientFor is Client closed at t's cleanup rather than at that of the
// test that started the server: for a server shared by subtests.
func (s *Server) ClientFor(t testing.TB) *redis.Client { return client(t, s.Addr) }

// PatientClientFor is ClientFor with read and write timeouts of d in
// place of the recommended ones (see Cluster.PatientClient).
func (s *Server) PatientClientFor(t testing.TB, d time.Duration) *redis.Client {
	o := recommended(s.Addr).Simple()
	o.PoolSize = 64
	o.ReadTimeout, o.WriteTimeout = d, d
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// ClientAt returns a client of the server at addr (a proxy's, say), as
// Client does.
func ClientAt(t testing.TB, addr string) *redis.Client { return client(t, addr) }

func client(t testing.TB, addr string) *redis.Client {
	o := recommended(addr).Simple()
	o.PoolSize = 64
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// Proxy forwards connections to a server, and cuts them on demand (see
// netcut.Proxy), for clients of the Redis server behind it.
type Proxy struct {
	*netcut.Proxy
	t testing.TB
}

// StartProxy starts a Proxy to s, stopped at the test's cleanup.
func StartProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	return &Proxy{Proxy: netcut.Start(t, s.Addr), t: t}
}

// Client returns a client that reaches the server through the proxy, with
// the timeouts the fleet package recommends, closed at the test's cleanup.
func (p *Proxy) Client() *redis.Client { return client(p.t, p.Addr) }

// recommended returns client options for addrs with the settings the fleet
// package recommends.
func recommended(addrs ...string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 addrs,
		DialTimeout:           250 * time.Millisecond,
		ReadTimeout:           500 * time.Millisecond, // the fleet's default WithTimeout
		WriteTimeout:          500 * time.Millisecond,
		ContextTimeoutEnabled: true,
		MaxRetries:            1,
		Protocol:              2, // RESP3 makes the client check for push notifications before each call
	}
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
		cl.Nodes = append(cl.Nodes, start(t, Server{port: freeClusterPort(t), args: []string{"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}}))
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
	for _, s := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		waitFor(t, "the cluster to be healthy on "+s.Addr, func() (bool, error) {
			info, err := c.ClusterInfo(ctx).Result()
			return strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r"), err
		})
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
	c := redis.NewClusterClient(recommended(addrs...).Cluster())
	cl.t.Cleanup(func() { c.Close() })
	return c
}

// PatientClient is Client with read and write timeouts of d in place of
// the recommended 500 ms, so that each call is bounded by its context's
// deadline up to d: a fleet's WithTimeout longer than the client's
// ReadTimeout has no effect (go-redis ends a read at the sooner of the
// two). For tests that give the store's calls a long WithTimeout because
// a call that times out is an error they count.
func (cl *Cluster) PatientClient(d time.Duration) *redis.ClusterClient {
	addrs := make([]string, len(cl.Nodes))
	for i, s := range cl.Nodes {
		addrs[i] = s.Addr
	}
	o := recommended(addrs...)
	o.ReadTimeout, o.WriteTimeout = d, d
	c := redis.NewClusterClient(o.Cluster())
	cl.t.Cleanup(func() { c.Close() })
	return c
}

// Sentinel is a master, one replica of it, and one Sentinel watching them
// (quorum 1), under the master name SentinelMaster: killing the master
// makes the Sentinel promote the replica within a few seconds.
type Sentinel struct {
	Master, Replica, Sentinel *Server
	t                         testing.TB
}

// SentinelMaster is the master name a Sentinel started by StartSentinel
// watches.
const SentinelMaster = "inflight-test"

// StartSentinel starts a master, a replica and a Sentinel, stopped at the
// test's cleanup, and returns once the Sentinel knows the replica.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	st := &Sentinel{t: t, Master: start(t, Server{})}
	st.Replica = start(t, Server{args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(st.Master.port)}})
	ctx := context.Background()
	waitFor(t, "the replica's link to the master", func() (bool, error) {
		c := redis.NewClient(&redis.Options{Addr: st.Replica.Addr})
		defer c.Close()
		info, err := c.Info(ctx, "replication").Result()
		return strings.Contains(info, "master_link_status:up"), err
	})
	// Sentinel rewrites its config file: it gets one of its own, writable.
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %[1]s 500\n"+
		"sentinel failover-timeout %[1]s 3000\n", SentinelMaster, st.Master.port)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	st.Sentinel = start(t, Server{conf: conf, args: []string{"--sentinel"}})
	waitFor(t, "the sentinel to know the replica", func() (bool, error) {
		c := redis.NewSentinelClient(&redis.Options{Addr: st.Sentinel.Addr})
		defer c.Close()
		replicas, err := c.Replicas(ctx, SentinelMaster).Result()
		return len(replicas) == 1, err
	})
	return st
}

// MasterAddr returns the master's address as the Sentinel reports it.
func (st *Sentinel) MasterAddr() (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: st.Sentinel.Addr})
	defer c.Close()
	addr, err := c.GetMasterAddrByName(context.Background(), SentinelMaster).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(addr[0], addr[1]), nil
}

// Client returns a failover client (Sentinel-aware) with the timeouts the
// fleet package recommends, closed at the test's cleanup.
func (st *Sentinel) Client() *redis.Client {
	o := recommended(st.Sentinel.Addr)
	o.MasterName = SentinelMaster
	c := redis.NewFailoverClient(o.Failover())
	st.t.Cleanup(func() { c.Close() })
	return c
}

// PatientClient is Client with read and write timeouts of d in place of
// the recommended 500 ms (see Cluster.PatientClient), for its calls to the
// master and to the Sentinel alike.
func (st *Sentinel) PatientClient(d time.Duration) *redis.Client {
	o := recommended(st.Sentinel.Addr)
	o.MasterName = SentinelMaster
	o.ReadTimeout, o.WriteTimeout = d, d
	c := redis.NewFailoverClient(o.Failover())
	st.t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds, failing the test after 20 s: for
// redis-server processes that reach a state on their own.
func waitFor(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: waiting for %s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond) // another process's progress: poll it
	}
}
