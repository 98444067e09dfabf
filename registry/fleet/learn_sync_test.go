package fleet

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// The end of a learned state's sync (syncedLocked), and a message's
// taking, under interleavings driven from inside the LimitFunc, which they
// call with the Registry's mu held and the learned caps' mu free.

// queueNoop queues an event that changes no cap (a start numbered 0, before
// any cut), as noteLocked queues one, capped at maxLearnPending.
func queueNoop(lk *learning) {
	if len(lk.pending) >= maxLearnPending {
		lk.pending = lk.pending[1:]
	}
	lk.pending = append(lk.pending, learnEvent{kind: evStarted})
	lk.queued++
}

// writtenLocked twice with the same upto drops nothing the second time,
// whatever was queued (and dropped by the bound) in between.
func TestWrittenEvidenceDroppedOnce(t *testing.T) {
	for _, between := range []int{0, 2, 255, 256, 300, 600} {
		for _, before := range []int{0, 3, 256} {
			t.Run(fmt.Sprintf("before=%d,between=%d", before, between), func(t *testing.T) {
				lk := &learning{}
				for range 10 { // written by an earlier sync
					queueNoop(lk)
				}
				lk.pending = nil
				for range before {
					queueNoop(lk)
				}
				upto := lk.queued
				for range between {
					queueNoop(lk)
				}
				lk.writtenLocked(upto)
				want := min(between, maxLearnPending)
				assert.Len(t, lk.pending, want)
				assert.GreaterOrEqual(t, lk.queued-uint64(len(lk.pending)), upto, "nothing up to upto left")
				lk.writtenLocked(upto)
				assert.Len(t, lk.pending, want, "the second call drops nothing")
			})
		}
	}
}

// syncWithHook opens a Registry named name on c that learns "p", its state
// read, and marks p syncing (the learner leaves it alone: the test syncs
// it) with 3 events pending; a func stored in hook runs once, in the
// LimitFunc, when the sync's end asks it (under r.mu, the learned caps' mu
// free). r is closed at the end of t.
func syncWithHook(t *testing.T, c *redis.Client, name string) (r *Registry[string], lk *learning, synced chan struct{}, hook *atomic.Pointer[func()]) {
	t.Helper()
	hook = new(atomic.Pointer[func()])
	r = NewWithKeys(redisstore.New(c, name), 100, Keys[string]{Limit: func(string) int {
		if f := hook.Load(); f != nil && calledFrom(".syncedLocked(") {
			hook.Store(nil)
			(*f)()
		}
		return 50
	}}, WithLogger(quiet()))
	t.Cleanup(r.Close)
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30}))
	settled(t, r, "p")
	r.learned.mu.Lock()
	defer r.learned.mu.Unlock()
	lk = r.learned.learning["p"]
	lk.syncingLocked()
	for range 3 {
		queueNoop(lk)
	}
	return r, lk, lk.synced, hook
}

// A sync that the store answers ends, with what it wrote no longer pending
// and what came meanwhile still pending, whether the LimitFunc panics at its
// end or not, and whether the bound dropped the oldest meanwhile.
func TestSyncEndsWithEvidenceMeanwhile(t *testing.T) {
	srv := redistest.Start(t)
	for _, between := range []int{2, 300} {
		for _, panics := range []bool{false, true} {
			t.Run(fmt.Sprintf("between=%d,panics=%v", between, panics), func(t *testing.T) {
				r, lk, synced, hook := syncWithHook(t, srv.Client(), fmt.Sprintf("ls-end-%d-%v", between, panics))
				f := func() {
					r.learned.mu.Lock() // under r.mu: the documented order
					for range between {
						queueNoop(lk)
					}
					r.learned.mu.Unlock()
					if panics {
						panic("limit func panics at the end of a sync")
					}
				}
				hook.Store(&f)
				func() {
					defer func() {
						p := recover()
						assert.Equal(t, panics, p != nil)
					}()
					r.syncLearned("p", lk)
				}()
				assert.Nil(t, hook.Load(), "the hook ran")
				require.True(t, lockFree(r))
				select {
				case <-synced:
				default:
					t.Fatal("the sync is not ended")
				}
				l := learnOf(r, "p")
				if l.synced != synced {
					// The learner's round (every learnRefresh) found p's
					// evidence pending once this sync ended, and began its own
					// sync, which may have written it already: what is left is
					// that sync's. Seen once in CI, with the learner's round
					// waiting for the lock the 300 queued held.
					t.Log("the learner began its own sync of p meanwhile; its end is not this test's")
					return
				}
				assert.False(t, l.syncing)
				assert.Len(t, l.pending, min(between, maxLearnPending), "the 3 written dropped, those meanwhile kept")
			})
		}
	}
}

// A sync that the store answers, of a key forgotten (and learned again)
// while its end asks the LimitFunc, ends on the learning it synced and
// leaves the new one alone.
func TestSyncEndsOnAKeyForgottenMeanwhile(t *testing.T) {
	srv := redistest.Start(t)
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%v", panics), func(t *testing.T) {
			r, lk, synced, hook := syncWithHook(t, srv.Client(), fmt.Sprintf("ls-forgot-%v", panics))
			relearned := make(chan error, 1)
			f := func() {
				// Forget's first half (its second takes r.mu, held here),
				// and a Learn that waits for r.mu.
				require.True(t, r.learned.forget("p"))
				go func() { relearned <- r.Learn("p", upstream.AdaptiveConfig{Initial: 20}) }()
				if panics {
					panic("limit func panics at the end of a sync")
				}
			}
			hook.Store(&f)
			func() {
				defer func() { assert.Equal(t, panics, recover() != nil) }()
				r.syncLearned("p", lk)
			}()
			require.NoError(t, <-relearned)
			require.True(t, lockFree(r))
			select {
			case <-synced:
			default:
				t.Fatal("the sync of the forgotten learning is not ended")
			}
			r.learned.mu.Lock()
			assert.False(t, lk.syncing)
			assert.Empty(t, lk.pending, "what it wrote is no longer pending")
			lk2 := r.learned.learning["p"]
			r.learned.mu.Unlock()
			require.NotSame(t, lk, lk2)
			settled(t, r, "p") // the new learning syncs
			assert.True(t, r.Learned("p").Enabled)
		})
	}
}

// A message for a key forgotten while it waited for the Registry's mu does
// not ask the LimitFunc for it: takeMessage looks again, under that mu.
func TestMessageForAKeyForgottenMeanwhile(t *testing.T) {
	srv := redistest.Start(t)
	var forgotten atomic.Bool
	var asked atomic.Int64
	r := NewWithKeys(redisstore.New(srv.Client(), "ls-msg"), 100, Keys[string]{Limit: func(k string) int {
		if k == "p" && forgotten.Load() && calledFrom(".takeMessage(") {
			asked.Add(1)
		}
		return 50
	}}, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30}))
	settled(t, r, "p")
	s, err := r.TryAcquire("p") // the epoch, told by a reply
	require.NoError(t, err)
	s.Release()
	require.NotZero(t, r.epoch.Load())
	lk := learnOf(r, "p")
	b, err := json.Marshal(storedCap{Key: lk.name, V: lk.stored.V + 1, E: r.epoch.Load(), F: learnedFormat, Cap: lk.stored.Cap})
	require.NoError(t, err)

	r.mu.Lock()
	done := make(chan struct{})
	go func() { defer close(done); r.learnedMessage(string(b)) }()
	fwUntil(t, "takeMessage waits for r.mu", func() bool {
		buf := make([]byte, 1<<20)
		st := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(st, "\n\ngoroutine ") {
			if strings.Contains(g, ".takeMessage(") {
				return strings.Contains(g, "(*Mutex).Lock") && !strings.Contains(g, ".message(")
			}
		}
		return false
	})
	forgot := make(chan struct{})
	go func() { defer close(forgot); r.Forget("p") }() // its second half waits for r.mu
	fwUntil(t, "p forgotten", func() bool { return r.learned.of("p") == nil })
	forgotten.Store(true)
	r.mu.Unlock()
	<-done
	<-forgot
	assert.Zero(t, asked.Load(), "Keys.Limit asked by takeMessage for a key forgotten before it took r.mu")
}
