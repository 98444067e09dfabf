package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// TestRegistrySetLimitDoesNotLetCallersPass: raising a key's limit must not
// make room that a newcomer can take ahead of a multi-key waiter that the
// raise makes servable.
func TestRegistrySetLimitDoesNotLetCallersPass(t *testing.T) {
	reg := registry.New[string](5)
	var a, b string
	for i := 0; ; i++ { // b's shard must lock before a's
		a, b = fmt.Sprint("a", i), fmt.Sprint("b", i)
		if reg.ShardOf(b) < reg.ShardOf(a) {
			break
		}
	}
	reg.SetLimit(a, 0)
	got := make(chan *slots.Slot, 1)
	go func() {
		s, err := reg.AcquireAll(context.Background(), a, b)
		if assert.NoError(t, err) {
			got <- s
		}
	}()
	for reg.Waiting(a) != 1 {
		runtime.Gosched()
	}
	// Hold b's shard, as if the goroutine raising the limit were descheduled
	// just before it could serve the waiter.
	unlock := reg.LockShard(reg.ShardOf(b))
	raised := make(chan struct{})
	go func() { reg.SetLimit(a, 1); close(raised) }()
	for !reg.MultiBusy() {
		runtime.Gosched()
	}
	for range 1000 { // let the raise get as far as it can
		runtime.Gosched()
	}
	// A newcomer on a key with a multi-key waiter decides under the raise's
	// lock, so it waits for the raise to finish, which serves the waiter.
	newcomer := make(chan error, 1)
	go func() {
		s, err := reg.TryAcquire(a)
		if s != nil {
			s.Release()
		}
		newcomer <- err
	}()
	for range 1000 {
		runtime.Gosched()
	}
	unlock()
	assert.ErrorIs(t, <-newcomer, slots.ErrLimitReached, "the newcomer must not pass the waiter")
	<-raised
	w := <-got
	assert.Equal(t, 1, reg.InFlight(a))
	w.Release()
	assert.Equal(t, 0, reg.Keys())
}

func TestRegistryLimitFuncColdBurst(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		proceed := make(chan struct{})
		var calls atomic.Int32
		fn := func(ctx context.Context, org string) (int, error) {
			calls.Add(1)
			<-proceed
			return 1, nil
		}
		reg := registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(quiet))
		b := startBurst(t, reg, 10, "new-org")
		assert.Equal(t, int32(1), calls.Load(), "one fetch for the burst")
		close(proceed)
		assert.Equal(t, int32(1), b.wait(), "the burst is capped by the fetched limit, not the default")
		b.release()
	})
	t.Run("a waiting caller's context ends", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			proceed := make(chan struct{})
			fn := func(ctx context.Context, org string) (int, error) { <-proceed; return 1, nil }
			reg := registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(quiet))
			go func() {
				s, err := reg.TryAcquire("org")
				if assert.NoError(t, err) {
					s.Release()
				}
			}()
			synctest.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := reg.Acquire(ctx, "org")
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			close(proceed)
		})
	})
}

// The caller whose acquire runs a key's first fetch leaves while others
// wait for it: the fetch ends with that caller's context, which says
// nothing of the key's limit, so the callers waiting fetch it again (one
// of them, the others waiting for that fetch) rather than take the
// default. Before, all five waiting were admitted under the default of 64
// on a key whose limit is 1.
func TestRegistryLimitFuncFirstFetchersCallerLeaves(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var calls atomic.Int32
		fn := func(ctx context.Context, org string) (int, error) {
			if calls.Add(1) == 1 {
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 1, nil
		}
		reg := registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(quiet))
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() {
			s, err := reg.Acquire(ctx, "org")
			if err == nil {
				s.Release()
			}
			first <- err
		}()
		synctest.Wait()
		b := startBurst(t, reg, 5, "org")
		cancel()
		assert.ErrorIs(t, <-first, context.Canceled)
		assert.Equal(t, int32(1), b.wait(), "capped by the limit fetched again, not the default")
		assert.Equal(t, int32(2), calls.Load(), "fetched again once, for all that waited")
		assert.Equal(t, 1, reg.Limit("org"))
		b.release()
	})
}

// A prune between the failed fetch's end and its waiters' waking (here
// the sweep of every shard, due two minutes on and run by an acquire of
// another key from the failed fetch's log line) drops the key's record:
// the waiters still fetch again, for what their fetch said goes with it,
// not with the record. (A first fix kept it in the record: 5 admitted.)
func TestRegistryLimitFuncRefetchOutlivesAPrune(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var calls atomic.Int32
		fn := func(ctx context.Context, org string) (int, error) {
			if org != "org" {
				return 1000, nil
			}
			if calls.Add(1) == 1 {
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 1, nil
		}
		var reg *registry.Registry[string]
		var once sync.Once
		log := slog.New(hookHandler(func(r slog.Record) {
			if strings.Contains(r.Message, "limit lookup failed") {
				once.Do(func() {
					if s, err := reg.TryAcquire("other"); assert.NoError(t, err) {
						s.Release()
					}
				})
			}
		}))
		reg = registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(log))
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() {
			_, err := reg.Acquire(ctx, "org")
			first <- err
		}()
		synctest.Wait()
		b := startBurst(t, reg, 5, "org")
		time.Sleep(2 * time.Minute) // the sweep is due
		cancel()
		assert.ErrorIs(t, <-first, context.Canceled)
		assert.Equal(t, int32(1), b.wait(), "capped by the limit fetched again")
		b.release()
	})
}

// A limit fetched while the key's record is not worth keeping once idle
// (RefreshLimits came during the fetch; or the fetch took longer than
// the record is kept) is still the limit of those that waited for it,
// though a prune comes before they take it: here the sweep of every
// shard, due and run by each caller's fetch of its second key's limit.
// Before, all six were admitted under the default of 64, and the key
// kept it.
func TestRegistryLimitFuncFetchedLimitOutlivesAPrune(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fetch   time.Duration
		refresh bool
	}{
		{"RefreshLimits during the fetch", 2 * time.Minute, true},
		{"a fetch longer than the record is kept", (registry.LimitRetention + 1) * time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				reg := registry.NewWithLimitFunc(64, slowLimits("org", tc.fetch), time.Minute, slots.WithLogger(quiet))
				b := startBurst(t, reg, 6, "org", "other")
				if tc.refresh {
					reg.RefreshLimits(func(string) bool { return true })
				}
				time.Sleep(tc.fetch + time.Minute)
				assert.Equal(t, int32(1), b.wait(), "capped by the limit fetched")
				assert.Equal(t, 1, reg.Limit("org"))
				b.release()
			})
		})
	}
}

// A multi-key caller resolves its first key's limit, then waits for its
// second key's first fetch, longer than a refresh interval; meanwhile the
// first key's record is marked stale (RefreshLimits) or grows older than
// it is kept, and a prune drops it (the sweep of every shard, run by an
// acquire of another key). The lanes are made with the limits the caller
// resolved, not the default: before, all six were admitted on a key of 1.
func TestRegistryLimitFuncMultiKeyWaitOutlivesAPrune(t *testing.T) {
	for _, tc := range []struct {
		name    string
		slow    time.Duration
		refresh bool
	}{
		{"RefreshLimits while it waits", 2 * time.Minute, true},
		{"a second fetch longer than the first key's record is kept", (registry.LimitRetention + 2) * time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				reg := registry.NewWithLimitFunc(64, slowLimits("slow", tc.slow), time.Minute, slots.WithLogger(quiet))
				b := startBurst(t, reg, 6, "org", "slow")
				if tc.refresh {
					time.Sleep(30 * time.Second)
					reg.RefreshLimits(func(k string) bool { return k == "org" })
					time.Sleep(time.Minute)
				} else {
					time.Sleep(tc.slow - time.Minute)
				}
				s, err := reg.TryAcquire("x") // the sweep, before the second fetch ends
				require.NoError(t, err)
				s.Release()
				require.Equal(t, 64, reg.Limit("org"), "the first key's record is gone while its callers wait")
				time.Sleep(2 * time.Minute)
				assert.Equal(t, int32(1), b.wait(), "capped by the limit fetched for the first key")
				assert.Equal(t, 1, reg.Limit("org"))
				b.release()
			})
		})
	}
}

// Callers that find an override on a key whose first fetch runs wait for
// the fetch all the same, so that a ClearLimit meanwhile does not let them
// in under the default. Before, one was admitted under the override while
// the fetch ran and the rest queued, then let in under the default once
// it was cleared (five on a key of 1); and callers of two keys waiting
// for the other key's shorter fetch made their lanes at the default.
func TestRegistryClearLimitDuringTheFirstFetch(t *testing.T) {
	for _, keys := range [][]string{{"org"}, {"org", "b"}} {
		t.Run(strings.Join(keys, ","), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				fn := func(ctx context.Context, k string) (int, error) {
					if k == "b" {
						time.Sleep(time.Minute)
						return 1000, nil
					}
					time.Sleep(2 * time.Minute)
					return 1, nil
				}
				reg := registry.NewWithLimitFunc[string](64, fn, time.Hour, slots.WithLogger(quiet))
				hold := make(chan struct{})
				var admitted atomic.Int32
				var wg sync.WaitGroup
				acquire := func() {
					if s, err := reg.AcquireAll(context.Background(), keys...); err == nil {
						admitted.Add(1)
						<-hold
						s.Release()
					}
				}
				wg.Go(acquire) // runs the first fetch
				synctest.Wait()
				reg.SetLimit("org", 1)
				for range 5 {
					wg.Go(acquire)
				}
				synctest.Wait()
				reg.ClearLimit("org")
				time.Sleep(90 * time.Second) // org's fetch runs; b's would have ended
				synctest.Wait()
				assert.Zero(t, admitted.Load(), "waiting for the fetch, override or not")
				time.Sleep(2 * time.Minute) // org's, then b's
				synctest.Wait()
				assert.Equal(t, int32(1), admitted.Load(), "the limit fetched")
				assert.Equal(t, 1, reg.Limit("org"))
				close(hold)
				wg.Wait()
			})
		})
	}
}

// A key's first fetch that fails after its override was cleared leaves the
// key at the default (no override, no limit fetched), not at the override
// that was cleared.
func TestRegistryClearLimitThenTheFirstFetchFails(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		fn := func(ctx context.Context, k string) (int, error) {
			time.Sleep(2 * time.Minute)
			return 0, errors.New("down")
		}
		reg := registry.NewWithLimitFunc[string](1, fn, time.Minute, slots.WithLogger(quiet))
		first := startBurst(t, reg, 1, "org") // runs the first fetch
		reg.SetLimit("org", 4)
		b := startBurst(t, reg, 4, "org")
		reg.ClearLimit("org")
		time.Sleep(3 * time.Minute)
		assert.Equal(t, 1, reg.Limit("org"), "the default")
		assert.Equal(t, int32(1), first.wait()+b.wait(), "admitted under the default, for the fetch failed")
		assert.Equal(t, 1, reg.InFlight("org"))
		first.release()
		b.release()
	})
}

// A LimitFunc's 0 (a tenant switched off) is a limit like any other: a
// burst on the new key, and a multi-key caller whose record of it was
// pruned while it waited for its other key, admit nobody.
func TestRegistryLimitFuncOfZero(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		fn := func(ctx context.Context, k string) (int, error) {
			switch k {
			case "slow":
				time.Sleep(2 * time.Minute)
				return 1000, nil
			case "off":
				time.Sleep(time.Second)
				return 0, nil
			}
			return 1, nil
		}
		reg := registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(quiet))
		assert.Zero(t, startBurst(t, reg, 10, "off").wait(), "a burst on the new key")
		b := startBurst(t, reg, 6, "off", "slow")
		time.Sleep(30 * time.Second)
		reg.RefreshLimits(func(k string) bool { return k == "off" })
		time.Sleep(time.Minute)
		s, err := reg.TryAcquire("x") // the sweep: off's record goes
		require.NoError(t, err)
		s.Release()
		require.Equal(t, 64, reg.Limit("off"), "off's record pruned")
		assert.Zero(t, b.wait(), "multi-key callers that resolved 0")
	})
}

// While the source is down, a key's last fetched limit is kept until it
// is LimitRetention refresh intervals old, as documented, also for a key
// acquired every refresh interval (each failed fetch leaves it as old).
func TestRegistryLimitFuncForgetsAfterRetentionWhileDown(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var down atomic.Bool
		fn := func(ctx context.Context, k string) (int, error) {
			if down.Load() {
				return 0, errors.New("down")
			}
			return 1, nil
		}
		reg := registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(quiet))
		s, err := reg.TryAcquire("org")
		require.NoError(t, err)
		s.Release()
		down.Store(true)
		for range 3 * registry.LimitRetention {
			time.Sleep(50 * time.Second)
			if s, err := reg.TryAcquire("org"); err == nil {
				s.Release()
			}
		}
		assert.Equal(t, 64, reg.Limit("org"), "forgotten once LimitRetention intervals old")
	})
}

// The limit fetched again by a waiter is as fresh as its fetch, not as
// the moment the waiter began to wait: after a wait longer than the
// refresh interval, the next acquire does not fetch it once more.
func TestRegistryLimitFuncRefetchIsFresh(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var calls atomic.Int32
		fn := func(ctx context.Context, org string) (int, error) {
			if calls.Add(1) == 1 {
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 1, nil
		}
		reg := registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(quiet))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		go func() { _, _ = reg.Acquire(ctx, "org") }()
		synctest.Wait()
		s, err := reg.TryAcquire("org") // waits two minutes, then fetches again
		require.NoError(t, err)
		s.Release()
		s, err = reg.TryAcquire("org")
		require.NoError(t, err)
		s.Release()
		assert.Equal(t, int32(2), calls.Load(), "the limit fetched a moment ago is not fetched again")
	})
}

// slowLimits is a LimitFunc whose fetch of the key slow takes d: "org"
// has a limit of 1, every other key 1000.
func slowLimits(slow string, d time.Duration) registry.LimitFunc[string] {
	return func(ctx context.Context, k string) (int, error) {
		if k == slow {
			time.Sleep(d)
		}
		if k == "org" {
			return 1, nil
		}
		return 1000, nil
	}
}

// burst is callers of TryAcquireAll started one after another, each
// keeping what it is admitted with (startBurst).
type burst struct {
	wg       sync.WaitGroup
	admitted atomic.Int32
	mu       sync.Mutex
	held     []*slots.Slot
}

// startBurst starts n callers of reg.TryAcquireAll(keys...), each once
// the one before has blocked or returned; those not admitted must be
// refused for the limit.
func startBurst(t *testing.T, reg *registry.Registry[string], n int, keys ...string) *burst {
	b := new(burst)
	for range n {
		b.wg.Go(func() {
			s, err := reg.TryAcquireAll(keys...)
			if err != nil {
				assert.ErrorIs(t, err, slots.ErrLimitReached)
				return
			}
			b.admitted.Add(1)
			b.mu.Lock()
			b.held = append(b.held, s)
			b.mu.Unlock()
		})
		synctest.Wait()
	}
	return b
}

// wait waits for the callers to return, and tells how many were admitted.
func (b *burst) wait() int32 {
	b.wg.Wait()
	return b.admitted.Load()
}

// release releases what the callers hold.
func (b *burst) release() {
	for _, s := range b.held {
		s.Release()
	}
}

// hookHandler is a slog.Handler that calls its function with each record.
type hookHandler func(slog.Record)

func (h hookHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h hookHandler) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h hookHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h hookHandler) WithGroup(string) slog.Handler                 { return h }

func TestRegistryLimitFuncGoexit(t *testing.T) {
	var calls atomic.Int32
	fn := func(ctx context.Context, org string) (int, error) {
		if calls.Add(1) == 1 {
			runtime.Goexit() // as t.FailNow would inside a lookup
		}
		return 2, nil
	}
	reg := registry.NewWithLimitFunc[string](64, fn, time.Minute, slots.WithLogger(quiet))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = reg.TryAcquire("org")
	}()
	<-done
	s, err := reg.TryAcquire("org")
	require.NoError(t, err, "the next caller fetches again instead of waiting forever")
	assert.Equal(t, 2, reg.Limit("org"))
	assert.Equal(t, int32(2), calls.Load())
	s.Release()
}

func TestRegistryLimitFuncPanicsAndNegatives(t *testing.T) {
	results := []func() (int, error){
		func() (int, error) { return 3, nil },
		func() (int, error) { panic("lookup bug") },
		func() (int, error) { return -1, nil },
	}
	var call atomic.Int32
	mock := clock.NewMock()
	fn := func(context.Context, string) (int, error) { return results[min(int(call.Add(1))-1, 2)]() }
	reg := registry.NewWithLimitFunc[string](1, fn, time.Minute, slots.WithClock(mock), slots.WithLogger(quiet))
	for range 3 {
		s, err := reg.TryAcquire("org")
		require.NoError(t, err)
		assert.Equal(t, 3, reg.Limit("org"), "a panic or a negative limit keeps the last good one")
		s.Release()
		mock.Add(2 * time.Minute)
	}
}

func TestRegistryLimitCacheFollowsLiveKeys(t *testing.T) {
	mock := clock.NewMock()
	fn := func(context.Context, int) (int, error) { return 1, nil }
	reg := registry.NewWithLimitFunc[int](1, fn, time.Minute, slots.WithClock(mock), slots.WithLogger(quiet))
	const n = 20_000
	held := make([]*slots.Slot, n)
	for i := range n {
		s, err := reg.TryAcquire(i)
		require.NoError(t, err)
		held[i] = s
	}
	assert.Equal(t, n, reg.CachedLimits())
	mock.Add(registry.LimitRetention * time.Minute) // past the retention of every cached limit
	for _, s := range held {
		s.Release()
	}
	assert.Equal(t, 0, reg.Keys())
	assert.Equal(t, 0, reg.CachedLimits(), "old limits of idle keys are forgotten")

	t.Run("an idle key's limit is kept until it is old, then pruned", func(t *testing.T) {
		mock := clock.NewMock()
		reg := registry.NewWithLimitFunc[int](1, fn, time.Minute, registry.WithShards(1), slots.WithClock(mock), slots.WithLogger(quiet))
		s, _ := reg.TryAcquire(-1)
		s.Release()
		assert.Equal(t, 1, reg.CachedLimits(), "a recent limit outlives its key")
		mock.Add(registry.LimitRetention * time.Minute)
		for i := range 100 { // new keys grow the cache until it prunes
			s, _ := reg.TryAcquire(i)
			s.Release()
		}
		assert.Equal(t, 100, reg.CachedLimits(), "the prune dropped the old idle limit and kept the recent ones")
	})
}

func TestRegistryRefreshLimits(t *testing.T) {
	mock := clock.NewMock()
	var mu sync.Mutex
	limits := map[string]int{"a": 1, "b": 1}
	fn := func(_ context.Context, k string) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return limits[k], nil
	}
	reg := registry.NewWithLimitFunc[string](5, fn, time.Hour, slots.WithClock(mock))
	for _, k := range []string{"a", "b"} {
		s, err := reg.TryAcquire(k)
		require.NoError(t, err)
		s.Release()
	}
	mu.Lock()
	limits["a"], limits["b"] = 0, 0
	mu.Unlock()
	reg.RefreshLimits(func(k string) bool { return k == "a" })
	_, err := reg.TryAcquire("a")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "a fetches its new limit at once")
	s, err := reg.TryAcquire("b")
	require.NoError(t, err, "b keeps its cached limit until its refresh")
	s.Release()
}

// A key whose fetched limit is 0 (a suspended tenant) stays refused while
// its LimitFunc fails after RefreshLimits: the refusals keep the limit
// known last, as they insert nothing else. (When a refusal dropped the
// cached limit, the next fetch that failed fell back to the default and
// admitted the caller.)
func TestRegistryRefusalsKeepTheFetchedLimit(t *testing.T) {
	var failing atomic.Bool
	fn := func(context.Context, string) (int, error) {
		if failing.Load() {
			return 0, fmt.Errorf("lookup down")
		}
		return 0, nil
	}
	mock := clock.NewMock()
	reg := registry.NewWithLimitFunc[string](10, fn, time.Minute, slots.WithClock(mock), slots.WithLogger(quiet))
	_, err := reg.TryAcquire("t")
	require.ErrorIs(t, err, slots.ErrLimitReached)
	reg.RefreshLimits(func(string) bool { return true })
	failing.Store(true)
	for range 3 {
		mock.Add(time.Second)
		s, err := reg.TryAcquire("t")
		if !assert.ErrorIs(t, err, slots.ErrLimitReached) {
			s.Release()
		}
	}
	assert.Zero(t, reg.Keys(), "no entry left by the refusals")
}

// A RefreshLimits made while the key's limit is being fetched (the fetch
// read the old limit) still makes the next admission fetch it again: the
// fetch under way recorded its old value as fresh for a whole refresh
// interval, and an org lowered from 3 to 1 took a second and a third slot.
func TestRefreshDuringAFetchIsKept(t *testing.T) {
	var limit atomic.Int64
	limit.Store(3)
	read, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	reg := registry.NewWithLimitFunc[string](3, func(context.Context, string) (int, error) {
		n := int(limit.Load())
		if first.CompareAndSwap(true, false) {
			close(read)
			<-release
		}
		return n, nil
	}, time.Minute)
	got := make(chan *slots.Slot, 1)
	go func() {
		s, err := reg.TryAcquire("org")
		assert.NoError(t, err)
		got <- s
	}()
	<-read // the lookup has read 3
	limit.Store(1)
	reg.RefreshLimits(func(string) bool { return true })
	close(release)
	held := <-got
	defer held.Release()
	_, err := reg.TryAcquire("org")
	require.ErrorIs(t, err, slots.ErrLimitReached, "a second slot under a limit of 1, refreshed before it was asked for")
	assert.Equal(t, 1, reg.Limit("org"))
}
