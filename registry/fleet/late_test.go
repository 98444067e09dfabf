package fleet

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// countingConn counts the script calls (EVALSHA, EVAL) written through it:
// those the server runs, however late.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n == len(b) {
		c.n.Add(int64(bytes.Count(b, []byte("$7\r\nevalsha\r\n")) + bytes.Count(b, []byte("$4\r\neval\r\n"))))
	}
	return n, err
}

// scriptsRun returns how many script calls the server has run, from its
// command statistics.
func scriptsRun(c *redis.Client) (int64, error) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, stats, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for f := range strings.SplitSeq(stats, ",") {
			if k, v, _ := strings.Cut(f, "="); k == "calls" || k == "rejected_calls" {
				x, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, err
				}
				n += x
			}
		}
	}
	return n, nil
}

// Calls that reach a stalled Redis (SIGSTOP) and fail on the client's side
// run when it resumes, however late. Here the stall outlasts the lease TTL:
// the process admits two callers under its local registry alone (their
// calls time out), they release, the removals of what the calls may add are
// given up, and only then does Redis resume and run the calls: the two
// acquire calls (the second carries the first degraded lease in) and the
// heartbeat's renewal that puts the degraded leases in, if it came before
// the breaker opened. None of them may add a lease that nobody holds.
func TestLateCallsAfterAStallAddNothing(t *testing.T) {
	srv := redistest.Start(t)
	o := &redis.Options{Addr: srv.Addr, DialTimeout: 250 * time.Millisecond, ReadTimeout: 250 * time.Millisecond,
		WriteTimeout: 250 * time.Millisecond, ContextTimeoutEnabled: true, MaxRetries: -1, Protocol: 2}
	var written atomic.Int64
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := new(net.Dialer).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, n: &written}, nil
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	admin := srv.Client()
	const ttl = time.Second
	r := New[string](redisstore.New(c, "late"), 2, WithLeaseTTL(ttl), WithBreaker(3, 20*time.Millisecond), WithLogger(quiet()))
	t.Cleanup(r.Close)
	stopped := false
	t.Cleanup(func() { // before Close
		if stopped {
			srv.Cont()
		}
	})
	ctx := context.Background()
	key := "inflight:{late}:k"
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	s.Release()
	require.Eventually(t, func() bool { n, err := admin.ZCard(ctx, key).Result(); return err == nil && n == 0 },
		5*time.Second, time.Millisecond)

	// Each call is sent once (no retries), on a connection made before the
	// stall: one dialled while the server is stopped never gets through
	// its handshake, and its call is never written.
	var warm []*redis.Conn
	for range 16 {
		cn := c.Conn()
		require.NoError(t, cn.Ping(ctx).Err())
		warm = append(warm, cn)
	}
	for _, cn := range warm {
		cn.Close()
	}
	ran, err := scriptsRun(admin)
	require.NoError(t, err)
	before := written.Load()
	srv.Stop()
	stopped = true
	a, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.True(t, a.Degraded())
	b, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.True(t, b.Degraded())
	a.Release()
	b.Release()
	require.Eventually(t, func() bool {
		st := r.Stats()
		return st.RemovalsPending == 0 && st.RemovalsDropped > 0
	}, 30*time.Second, time.Millisecond, "the removals are given up while Redis is stopped")
	late := written.Load() - before
	srv.Cont()
	stopped = false
	require.Eventually(t, func() bool { n, err := scriptsRun(admin); return err == nil && n >= ran+late },
		10*time.Second, time.Millisecond, "the %d calls sent while Redis was stopped have run", late)
	n, err := admin.ZCard(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "leases that nobody holds, added by late calls")
	t.Logf("%d script calls sent while Redis was stopped; %d removals given up", late, r.Stats().RemovalsDropped)
}

// A server clock that jumps ahead of what the replies told makes the next
// calls run past their not-after times: each is refused, and made once
// more with the clock the refusal told. Nothing fails.
func TestServerClockJumps(t *testing.T) {
	m := newMini(t)
	r := m.registry(2, WithLeaseTTL(time.Minute))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	m.advance(time.Hour)
	require.True(t, r.renew(), "a renewal")
	s2, err := r.TryAcquire("k")
	require.NoError(t, err, "an admission")
	assert.False(t, s2.Degraded())
	assert.Len(t, m.leases("k"), 2)
	assert.Zero(t, r.Stats().StoreErrors)
	s.Release()
	s2.Release()
	eventually(t, "removed", func() bool { return len(m.leases("k")) == 0 })
}

// Past the bound of pending removals, an abandon whose call may still run
// is kept: the released leases' removals go first, and an abandon goes
// once its call can no longer run, or if the call was made before the
// server's clock was known (those would have no bound).
func TestBoundKeepsAbandonsOfCallsStillOnTheirWay(t *testing.T) {
	m := newMini(t)
	r := m.registry(100)
	s, err := r.TryAcquire("k") // a reply: the server's clock is known
	require.NoError(t, err)
	s.Release()
	eventually(t, "removed", func() bool { return r.Stats().RemovalsPending == 0 && len(m.leases("k")) == 0 })
	r.remMu.Lock()
	r.maxPending = 2
	r.remMu.Unlock()
	r.storeMu.Lock() // a removal or renewal under way on a slow Redis
	defer r.storeMu.Unlock()
	r.queueRelease(&lease[string]{r: r, id: "first", names: []string{"k"}, limits: []int{1}})
	eventually(t, "the releaser took the first removal, and waits", func() bool { return r.Stats().RemovalsPending == 0 })
	abandon := func(until int64) *lease[string] {
		return &lease[string]{r: r, id: newLeaseID(), names: []string{"k"}, abandoned: true, until: until}
	}
	onItsWay, ranOut, unknown := abandon(r.clock.notAfter(time.Hour)), abandon(r.clock.notAfter(-time.Hour)), abandon(unknownUntil)
	released := &lease[string]{r: r, id: "c", names: []string{"k"}, limits: []int{1}}
	for _, l := range []*lease[string]{onItsWay, ranOut, unknown, released, released} {
		r.queueRelease(l)
	}
	r.remMu.Lock()
	kept := slices.Clone(r.removals)
	r.remMu.Unlock()
	assert.Equal(t, []*lease[string]{onItsWay, released}, kept)
	assert.Equal(t, uint64(3), r.Stats().RemovalsDropped)
}

// lateCall is a store whose next admission call fails on the client's
// side (as a timeout would) while the store still runs it: before the
// abandon that follows reaches the store, or after it. late is what the
// late call returned.
type lateCall struct {
	driver.Store
	armed      atomic.Bool
	afterTomb  bool          // run the late call once its tombstone exists
	tombExists func() bool   // with afterTomb
	ran        chan struct{} // closed once the late call has run
	late       driver.AdmitResult
}

func (h *lateCall) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if !h.armed.CompareAndSwap(true, false) {
		return h.Store.AdmitOne(ctx, c)
	}
	run := func() {
		h.late, _ = h.Store.AdmitOne(context.Background(), c)
		close(h.ran)
	}
	if !h.afterTomb {
		run() // the store runs it now...
	} else {
		go func() {
			for deadline := time.Now().Add(3 * time.Second); !h.tombExists() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond) // polling the server for the abandon
			}
			run() // ...or after the abandon
		}()
	}
	return driver.AdmitResult{Err: context.DeadlineExceeded}, context.DeadlineExceeded // ...but the client gives up
}

// An acquire call that fails on the client's side but runs on the server
// takes nothing: whether it runs before or after the abandon that follows,
// no lease is left behind, and a FallbackLocal admission made meanwhile is
// not in Redis either (its release leaves nothing).
func TestFailedCallTakesNothing(t *testing.T) {
	for _, afterTomb := range []bool{false, true} {
		for _, mode := range []Unavailable{FailClosed, FallbackLocal} {
			m := newMini(t)
			c := m.client()
			h := &lateCall{Store: redisstore.New(c, "t"), afterTomb: afterTomb, ran: make(chan struct{})}
			h.tombExists = func() bool {
				keys := m.Srv.Keys()
				for _, k := range keys {
					if len(k) > len("inflight:{t}:abandoned:") && k[:len("inflight:{t}:abandoned:")] == "inflight:{t}:abandoned:" {
						return true
					}
				}
				return false
			}
			r := New[string](h, 1, WithLeaseTTL(3*time.Second), WithUnavailable(mode))
			h.armed.Store(true)
			s, err := r.TryAcquire("k")
			if mode == FailClosed {
				require.ErrorIs(t, err, ErrUnavailable)
			} else {
				require.NoError(t, err)
				assert.True(t, s.Degraded())
			}
			<-h.ran
			require.NoError(t, h.late.Err)
			if afterTomb {
				assert.Equal(t, driver.StatusAbandoned, h.late.Status, "the tombstone refuses the late call")
			} else {
				assert.Equal(t, driver.StatusAdmitted, h.late.Status, "the late call took a lease, for the abandon to take back")
			}
			eventually(t, "whatever the late call added is removed", func() bool {
				return len(m.leases("k")) == 0 && r.Stats().RemovalsPending == 0
			})
			if s != nil {
				s.Release()
			}
			eventually(t, "the breaker closes", func() bool { return !r.Stats().BreakerOpen })
			s2, err := r.TryAcquire("k")
			require.NoError(t, err, "after tombstone %v, mode %v: the fleet has room", afterTomb, mode)
			s2.Release()
			r.Close()
		}
	}
}
