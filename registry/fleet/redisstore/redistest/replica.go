package redistest

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a redis-server replicating the one at addr (a
// Proxy's, for a link the test can cut), stopped at the test's cleanup,
// and returns once its link to the master is up.
func StartReplica(t testing.TB, addr string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s := start(t, Server{args: []string{"--replicaof", host, port}})
	waitFor(t, "the replica's link to the master", func() (bool, error) {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		defer c.Close()
		info, err := c.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "master_link_status:up"), err
	})
	return s
}

// Promote makes a replica a master (REPLICAOF NO ONE), as a failover does:
// it keeps what it had replicated, under a new replication ID.
func (s *Server) Promote() {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		s.t.Fatalf("redistest: promote %s: %v", s, err)
	}
}

// Switch is the address of a master as its clients dial it, which a test
// moves from one server to another as a failover moves a DNS name or a
// virtual IP.
type Switch struct {
	to atomic.Pointer[string]
	t  testing.TB
}

// NewSwitch returns a Switch to addr (a Server's, or a Proxy's).
func NewSwitch(t testing.TB, addr string) *Switch {
	sw := &Switch{t: t}
	sw.MoveTo(addr)
	return sw
}

// MoveTo makes new connections go to addr. Those open stay where they are.
func (sw *Switch) MoveTo(addr string) { sw.to.Store(&addr) }

// Client returns a client that dials the server the Switch is at, with the
// timeouts the fleet package recommends, closed at the test's cleanup.
func (sw *Switch) Client() *redis.Client {
	o := recommended("switch").Simple()
	var d net.Dialer
	o.Dialer = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, *sw.to.Load())
	}
	c := redis.NewClient(o)
	sw.t.Cleanup(func() { c.Close() })
	return c
}

// StartDurable starts a redis-server that writes every change to its
// append-only file before it answers (appendfsync always), in a directory
// of the test's: a Kill and Restart keep all it had.
func StartDurable(t testing.TB) *Server {
	t.Helper()
	return start(t, Server{args: []string{"--dir", t.TempDir(), "--appendonly", "yes", "--appendfsync", "always"}})
}
