package fleet

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
)

// A process that has had no reply from Redis yet gets a burst of waiters
// on a key another process holds at its limit, and Redis loses its data
// while the first waiter's call is on its way. The waiters after it call
// once its reply has told the epoch, so the emptied Redis pauses them
// while the other process's holders put their leases back: none is
// admitted over the cap meanwhile. (Calls sent before that reply carried
// no epoch, which the emptied Redis took for a first start: all ten were
// admitted beside the two live holders.)
//
// Redis loses its data once the first call has reached it, not at a set
// time: that call may have a connection to dial first (the Registry's
// Listen takes the client's one warm connection for its INFO in about one
// run in five, and a new connection sends HELLO and CLIENT SETINFO first),
// which is two round trips more; a loss before the call reaches Redis is
// one the process cannot tell from a first start (PROTOCOL.md, Lost
// leases). Flushed at a fixed 1.5 farLatency, the test failed in those
// runs with all ten admitted and none paused.
func TestBurstAtStartAcrossADataLoss(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		v := newVirtualRedis(t, farLatency)
		// reached is closed once Redis has read a call of r's on "k" (one
		// naming the key and r's process: its acquire calls).
		var proc atomic.Pointer[string] // r's, once r exists
		reached := make(chan struct{})
		var once sync.Once
		v.arrived = func(b []byte) {
			if p := proc.Load(); p != nil && bytes.Contains(b, []byte("\r\ninflight:{far-loss}:k\r\n")) && bytes.Contains(b, []byte(*p)) {
				once.Do(func() { close(reached) })
			}
		}
		other := fwFleet(t, v, "far-loss", 1, 2, WithLogger(quiet()))[0]
		for range 2 {
			s, err := other.TryAcquire("k")
			require.NoError(t, err)
			defer s.Release()
		}
		c := v.Client()
		loadScripts(t, c)
		r := New[string](redisstore.New(c, "far-loss"), 2, WithLogger(quiet()))
		t.Cleanup(r.Close)
		require.Zero(t, r.epoch.Load(), "no reply from Redis yet")
		proc.Store(&r.proc)
		t0 := time.Now()
		var early atomic.Int64
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(t.Context(), r.pause+time.Second)
				defer cancel()
				if s, err := r.Acquire(ctx, "k"); err == nil {
					if time.Since(t0) < r.pause {
						early.Add(1)
					}
					s.Release()
				}
			})
		}
		select {
		case <-reached: // the first call has reached Redis
		case <-time.After(r.pause):
			t.Fatal("no acquire call of r's reached Redis")
		}
		synctest.Wait()  // and has run there
		v.srv.FlushAll() // while its reply is on its way back
		require.Zero(t, r.epoch.Load(), "the first call's reply has not come back")
		wg.Wait()
		t.Logf("admitted during the pause: %d; paused tries %d", early.Load(), r.Stats().Paused)
		assert.Zero(t, early.Load(), "admitted while the other process's holders were not back")
		assert.Positive(t, r.Stats().Paused)
	})
}
