package redisstore_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// A Reserve whose caller gives up while the server is slow to answer
// (its context ends, as a client that hangs up ends an HTTP request's)
// charges nothing: the server still runs the call it was sent, and the
// charge it makes is taken back once its reply comes. It stood for the
// rest of the minute, refusing requests that the budget had room for.
func TestBudgetReserveGivenUpChargesNothing(t *testing.T) {
	srv := redistest.Start(t)
	s := redisstore.New(srv.PatientClientFor(t, 10*time.Second), "given-up")
	b, err := fleet.NewBudget(s, "provider", upstream.BudgetLimits{TokensPerMinute: 1000}, 5*time.Second)
	require.NoError(t, err)
	used, err := b.Used(context.Background()) // loads the script: the calls below are EVALSHAs
	require.NoError(t, err)
	require.Equal(t, 0, used[0])
	admin := srv.Client()
	calls := func() int { // the budget's calls the server has run
		stats, err := admin.InfoMap(context.Background(), "commandstats").Result()
		require.NoError(t, err)
		var n int
		_, _ = fmt.Sscanf(stats["Commandstats"]["cmdstat_evalsha"], "calls=%d", &n)
		return n
	}
	before := calls()

	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 600})
	cancel()
	srv.Cont()
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// The server runs the call it was sent once it runs again, and its
	// reply comes then: the charge it made is taken back, by a call of
	// its own (counted before the budget is read: a read that came first
	// would find nothing charged yet).
	assert.Eventually(t, func() bool { return calls() >= before+2 }, 10*time.Second, 10*time.Millisecond, "the charge and its take-back")
	used, err = b.Used(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 0, used[0], "the request was never sent: nothing stays charged")
	_, err = b.Reserve(context.Background(), upstream.Tokens{Input: 600})
	assert.NoError(t, err, "the budget has room for it")
}

// replyDropper forwards connections to a Redis server and, once armed,
// drops the next reply the server sends and closes that client's
// connection: the server ran the call, its reply was lost to a broken
// connection, and go-redis tries the call again (io.EOF is retried, up to
// MaxRetries: 1 in the recommended options).
type replyDropper struct {
	addr    string
	armed   atomic.Bool
	dropped atomic.Int32
}

func startReplyDropper(t *testing.T, to string) *replyDropper {
	d := &replyDropper{}
	d.addr = relay(t, to, func(c, s net.Conn, wg *sync.WaitGroup) {
		wg.Go(func() { _, _ = io.Copy(s, c); s.Close(); c.Close() })
		wg.Go(func() {
			defer func() { s.Close(); c.Close() }()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && d.armed.CompareAndSwap(true, false) {
					d.dropped.Add(1)
					return // the reply is lost with the connection
				}
				if n > 0 {
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	})
	return d
}

// relay forwards the connections made to the address it returns to a
// server at to: each pair, the client's (c) and the server's (s), is
// handed to conn, which starts the goroutines that copy between them on
// wg. The test's cleanup closes the listener and waits for them.
func relay(t *testing.T, to string, conn func(c, s net.Conn, wg *sync.WaitGroup)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			conn(c, s, &wg)
		}
	})
	return ln.Addr().String()
}

// budgetOf100 returns a Budget of 100 tokens a minute named name on s,
// and a reader of the tokens it counts.
func budgetOf100(t *testing.T, s *redisstore.Store, name string) (*fleet.Budget, func() int) {
	t.Helper()
	b, err := fleet.NewBudget(s, name, upstream.BudgetLimits{TokensPerMinute: 100}, 5*time.Second)
	require.NoError(t, err)
	return b, func() int {
		t.Helper()
		u, err := b.Used(context.Background())
		require.NoError(t, err)
		return u[0]
	}
}

// A budget call is run once, whatever the client does when its reply is
// lost: go-redis sends a call again when the connection breaks before its
// reply (MaxRetries, 1 in the recommended options), and the script, run
// twice, took a cancelled reservation back twice: the second take-back
// took another request's charge, which then did not count, and the budget
// admitted 150 tokens in a minute against 100.
func TestBudgetCallRetriedRunsOnce(t *testing.T) {
	srv := redistest.Start(t)
	d := startReplyDropper(t, srv.Addr)
	s := redisstore.New(redistest.ClientAt(t, d.addr), "retried")
	b, used := budgetOf100(t, s, "provider")
	ctx := context.Background()

	first, err := b.Reserve(ctx, upstream.Tokens{Input: 50})
	require.NoError(t, err)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 50}) // another request, under way
	require.NoError(t, err)
	d.armed.Store(true)
	require.NoError(t, first.Cancel(ctx), "its reply lost, then the call again")
	require.Equal(t, int32(1), d.dropped.Load())
	assert.Equal(t, 50, used(), "the other request's charge stands")
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 100})
	assert.ErrorIs(t, err, upstream.ErrOverBudget, "100 started in this minute already")

	other, otherUsed := budgetOf100(t, s, "model")
	d.armed.Store(true)
	_, err = other.Reserve(ctx, upstream.Tokens{Input: 30})
	require.NoError(t, err)
	require.Equal(t, int32(2), d.dropped.Load())
	assert.Equal(t, 30, otherUsed(), "a charge sent again is charged once")
}

// callHolder forwards connections to a Redis server and, once armed,
// holds the next call a client sends until released (as a packet lost and
// sent again reaches the server late, after the client gave up that
// connection): go-redis's read times out, and it sends the call again on
// another connection, which runs first. ran is closed once the server has
// answered the held call.
type callHolder struct {
	addr    string
	armed   atomic.Bool
	held    chan struct{} // closed once a call is held
	release chan struct{}
	ran     chan struct{}
}

func startCallHolder(t *testing.T, to string) *callHolder {
	h := &callHolder{held: make(chan struct{}), release: make(chan struct{}), ran: make(chan struct{})}
	h.addr = relay(t, to, func(c, s net.Conn, wg *sync.WaitGroup) {
		var late atomic.Bool // this connection's held call has gone to the server
		answered := make(chan struct{})
		wg.Go(func() { // the server's answers
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && late.Load() {
					close(h.ran)
					close(answered)
					return
				}
				if n > 0 {
					_, _ = c.Write(buf[:n])
				}
				if err != nil {
					return
				}
			}
		})
		wg.Go(func() { // the client's calls
			defer s.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 && h.armed.CompareAndSwap(true, false) {
					call := append([]byte(nil), buf[:n]...)
					close(h.held)
					<-h.release
					late.Store(true)
					if _, err := s.Write(call); err == nil {
						<-answered
					}
					return
				}
				if n > 0 {
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	})
	t.Cleanup(func() { // before the relay's (cleanups run last first): a held call goes on
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	})
	return h
}

// A charge refused when it ran keeps its reply too: the same call run
// later (its first sending, held up on the way and delivered after
// go-redis's retry of it was refused) answers as the retry did and
// charges nothing. Found by review: it charged 50 tokens then, which the
// caller, told it was refused, never took back.
func TestBudgetRefusedCallRunLateChargesNothing(t *testing.T) {
	srv := redistest.Start(t)
	h := startCallHolder(t, srv.Addr)
	b, used := budgetOf100(t, redisstore.New(redistest.ClientAt(t, h.addr), "late"), "provider")
	ctx := context.Background()
	first, err := b.Reserve(ctx, upstream.Tokens{Input: 50})
	require.NoError(t, err)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 50})
	require.NoError(t, err)

	h.armed.Store(true)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 50}) // held, timed out, sent again: refused
	<-h.held
	require.ErrorIs(t, err, upstream.ErrOverBudget)
	require.NoError(t, first.Cancel(ctx)) // room for 50 again
	require.Equal(t, 50, used())
	close(h.release) // the call first sent reaches the server
	<-h.ran
	assert.Equal(t, 50, used(), "the refused call, run late, charges nothing")
}

// A check (driver.BudgetCall's Check) changes nothing, so it keeps no
// reply under its call's id (run again, it answers anew), and writes no
// step.
func TestBudgetCheckKeepsNothing(t *testing.T) {
	m := redistest.StartMini(t)
	s := redisstore.New(m.Client(), "check")
	ctx := context.Background()
	call := func(cost int64, check bool) driver.BudgetResult {
		t.Helper()
		res, err := s.Budget(ctx, &driver.BudgetCall{Key: "k", Limits: [3]int64{100}, Cost: [3]int64{cost, cost}, Check: check})
		require.NoError(t, err)
		return res
	}
	assert.False(t, call(60, true).Charged)
	assert.Empty(t, m.Srv.Keys(), "nothing written")
	require.True(t, call(60, false).Charged)
	keys := m.Srv.Keys()
	require.Len(t, keys, 2, "the budget, and the charge's reply")
	assert.False(t, call(50, true).Charged)
	assert.False(t, call(30, true).Charged)
	assert.Equal(t, keys, m.Srv.Keys(), "no reply kept, no step written")
	assert.Equal(t, [3]int64{60, 60, 0}, call(0, true).Used)
}
