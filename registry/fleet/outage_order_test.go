package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// While the store cannot be reached (FallbackLocal), this process's
// waiters are woken by its releases (PROTOCOL.md, Waiting), and a newcomer
// never passes a waiter that could take the room (package doc). A lease
// admitted in the store before the outage and released during it woke no
// waiter: the waiter slept out its backoff, and a TryAcquire made
// meanwhile took the room ahead of it.
func TestOutageReleaseWakesLocalWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Second), WithPoll(5*time.Second, 5*time.Second))
		defer r.Close()
		held, err := r.TryAcquire("k") // in the store
		require.NoError(t, err)
		ms.Kill()
		got := make(chan *slots.Slot, 1)
		go func() {
			s, err := r.Acquire(context.Background(), "k")
			if err == nil {
				got <- s
			}
			close(got)
		}()
		synctest.Wait()
		require.True(t, r.Stats().BreakerOpen)
		require.Equal(t, 1, r.Stats().Waiting)
		held.Release()
		synctest.Wait()
		select {
		case s := <-got:
			require.NotNil(t, s)
			s.Release()
		default:
			s, err := r.TryAcquire("k")
			if err == nil {
				t.Errorf("a TryAcquire passed the waiter, which was not woken by the release")
				s.Release()
			} else {
				t.Errorf("the waiter was not woken by the release")
			}
			ms.Restart()
			s = <-got
			if s != nil {
				s.Release()
			}
		}
	})
}

// The same with a lease admitted during the outage (degraded), whose
// release wakes the waiter: a TryAcquire made right after the release,
// before the woken waiter runs, takes the room ahead of it.
func TestOutageNewcomerDoesNotPassWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Second), WithPoll(5*time.Second, 5*time.Second))
		defer r.Close()
		ms.Kill()
		held, err := r.TryAcquire("k") // the call fails: admitted outside the store
		require.NoError(t, err)
		require.True(t, r.Stats().BreakerOpen)
		got := make(chan *slots.Slot, 1)
		go func() {
			s, err := r.Acquire(context.Background(), "k")
			if err == nil {
				got <- s
			}
			close(got)
		}()
		synctest.Wait()
		require.Equal(t, 1, r.Stats().Waiting)
		held.Release()
		if s, err := r.TryAcquire("k"); err == nil {
			t.Errorf("a TryAcquire passed the waiter")
			s.Release()
		}
		ms.Restart()
		if s := <-got; s != nil {
			s.Release()
		}
	})
}

// A release while the store cannot be reached wakes this process's next
// waiter once the lease's local room is free, not before: a waiter woken
// first found the key still full under the local registry, and slept out
// its backoff (here an hour) before it looked again. releaseHook gives the
// waiter all the time it needs between the release of the lease and the
// freeing of its local mirror, for a lease admitted in the store before
// the outage and for one admitted during it (degraded).
func TestOutageReleaseWakesWaiterOnceRoomIsFree(t *testing.T) {
	for _, degraded := range []bool{false, true} {
		t.Run(fmt.Sprintf("degraded=%v", degraded), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				ms := memstore.New()
				r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(time.Hour, time.Hour))
				defer r.Close()
				if degraded {
					ms.Kill()
				}
				held, err := r.TryAcquire("k")
				require.NoError(t, err)
				require.Equal(t, degraded, held.Degraded())
				ms.Kill()
				got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
				synctest.Wait()
				require.True(t, r.Stats().BreakerOpen)
				require.Equal(t, 1, r.Stats().Waiting)
				hooked := false
				r.releaseHook = func() {
					hooked = true
					synctest.Wait() // a waiter woken now runs its try to the end
					select {
					case <-got:
						t.Errorf("the waiter was admitted before the local room was free")
					default:
					}
				}
				released := time.Now()
				held.Release()
				r.releaseHook = nil
				require.True(t, hooked)
				s := admittedAtOnce(t, got, released)
				_, err = r.TryAcquire("k")
				require.ErrorIs(t, err, slots.ErrLimitReached, "the waiter holds the one slot")
				s.Release()
			})
		})
	}
}

// A release wakes this process's next waiter also when the breaker opens
// between its look at the breaker (releasing, closed) and the freeing of
// its local mirror: the breaker's opening woke the waiters in the fleet's
// queue (backInLine), which found the key full still under the local
// registry and went to sleep for their backoff (here an hour).
func TestBreakerOpeningAsAReleaseFreesItsRoomWakesTheWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(time.Hour, time.Hour))
		defer r.Close()
		held, err := r.TryAcquire("k")
		require.NoError(t, err)
		require.False(t, held.Degraded())
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
		synctest.Wait()
		require.Equal(t, 1, r.Stats().Waiting, "queued in the store")
		var other *slots.Slot
		r.releaseHook = func() {
			ms.Kill()
			other, err = r.TryAcquire("other") // its failed call opens the breaker
			require.NoError(t, err)
			synctest.Wait()
			require.True(t, r.Stats().BreakerOpen)
		}
		released := time.Now()
		held.Release()
		r.releaseHook = nil
		s := admittedAtOnce(t, got, released)
		_, err = r.TryAcquire("k")
		require.ErrorIs(t, err, slots.ErrLimitReached, "the waiter holds the one slot")
		s.Release()
		other.Release()
	})
}

// failingAdmits is a store whose admission calls fail while fail is set;
// its other calls are answered, so that only the admissions count against
// the breaker. With hold set, the next admission call is made in the store,
// then tells arrived and waits for gate before it answers.
type failingAdmits struct {
	*memstore.Store
	fail          atomic.Bool
	hold          atomic.Bool
	arrived, gate chan struct{}
}

func (s *failingAdmits) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if s.fail.Load() {
		return driver.AdmitResult{Err: errStoreDown}, errStoreDown
	}
	defer s.held()
	return s.Store.AdmitOne(ctx, c)
}

func (s *failingAdmits) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	if s.fail.Load() {
		return nil, errStoreDown
	}
	defer s.held()
	return s.Store.Admit(ctx, calls)
}

func (s *failingAdmits) held() {
	if s.hold.CompareAndSwap(true, false) {
		close(s.arrived)
		<-s.gate
	}
}

// A release of a lease admitted outside the store (the store's call for it
// failed, the breaker closed) wakes a waiter that found the key full
// because of it, though the release came after the waiter's try looked
// and before it recorded the key it found full: its call, placed in the
// fleet's line, had left it holding back no key, and the release, which
// wakes only a waiter that holds the key back (wokenBy), passed it by. It
// slept out its backoff (here an hour). fullHook releases the lease in
// that gap, for a waiter whose own call failed too (full under the local
// registry) and for one whose call the store answered, admitted, as the
// lease was admitted outside it, and that gave its lease back for that one
// (see outsideMeanwhile).
func TestOutsideReleaseWakesWaiterBeforeItRecordsTheKeyFull(t *testing.T) {
	for _, answered := range []bool{false, true} {
		t.Run(fmt.Sprintf("answered=%v", answered), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				st := &failingAdmits{Store: memstore.New(), arrived: make(chan struct{}), gate: make(chan struct{})}
				r := New[string](st, 1, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Hour, time.Hour))
				defer r.Close()
				s, err := r.TryAcquire("k") // a reply: the waiter's call is placed in line (see placed)
				require.NoError(t, err)
				s.Release()
				synctest.Wait()
				var held *slots.Slot
				outside := func() {
					st.fail.Store(true)
					held, err = r.TryAcquire("k")
					require.NoError(t, err)
					require.True(t, held.Degraded())
					st.fail.Store(false)
				}
				if answered {
					st.hold.Store(true) // the waiter's call, once the store has admitted it
				} else {
					outside()
					st.fail.Store(true)
				}
				hooked := false
				r.fullHook = func() {
					r.fullHook = nil
					hooked = true
					held.Release()
				}
				got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
				if answered {
					<-st.arrived
					outside() // after the waiter's call left, without it
					close(st.gate)
				}
				s = admittedAtOnce(t, got, time.Now())
				require.True(t, hooked)
				require.False(t, r.Stats().BreakerOpen)
				require.Equal(t, !answered, s.Degraded())
				_, err = r.TryAcquire("k")
				require.ErrorIs(t, err, slots.ErrLimitReached, "the waiter holds the one slot")
				s.Release()
			})
		})
	}
}

// A waiter that the local registry refuses while its key has room by the
// count (here the room is reserved for another class: slots.WithShare)
// sleeps out its backoff as before, and does not look again at once, over
// and over: the look after it records the key is for a release since its
// try counted the key.
func TestOutageWaiterRefusedWithRoomLeftDoesNotSpin(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 2, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(time.Minute, time.Minute),
			WithLocalOptions(slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 1})))
		defer r.Close()
		ms.Kill()
		held, err := r.TryAcquire("k")
		require.NoError(t, err)
		require.True(t, r.Stats().BreakerOpen)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		var looks atomic.Int32
		r.fullHook = func() {
			if looks.Add(1) > 100 {
				cancel() // a spin: end it
			}
		}
		start := time.Now()
		_, err = r.Acquire(ctx, "k")
		require.Error(t, err)
		r.fullHook = nil
		assert.LessOrEqual(t, looks.Load(), int32(20), "looks at the full key in %v", time.Since(start))
		held.Release()
	})
}

// The gap of TestOutsideReleaseWakesWaiterBeforeItRecordsTheKeyFull, for a
// waiter the local registry refuses with room left by the count (a class's
// reserved share): its refusal counts the key's holders as well, so that a
// release between its try and its record of the key is seen.
func TestRefusedWithRoomLeftSeesAReleaseBeforeItRecordsTheKey(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		st := &failingAdmits{Store: memstore.New(), arrived: make(chan struct{}), gate: make(chan struct{})}
		r := New[string](st, 2, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Hour, time.Hour),
			WithLocalOptions(slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 1})))
		defer r.Close()
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		s.Release()
		synctest.Wait()
		st.fail.Store(true)
		held, err := r.TryAcquire("k")
		require.NoError(t, err)
		require.True(t, held.Degraded())
		require.False(t, r.Stats().BreakerOpen)
		hooked := false
		r.fullHook = func() {
			r.fullHook = nil
			hooked = true
			held.Release()
		}
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
		s = admittedAtOnce(t, got, time.Now())
		require.True(t, hooked)
		s.Release()
	})
}

// A waiter the store admitted and that gave its lease back for a lease this
// process admitted outside the store meanwhile (outsideMeanwhile) is not
// in the fleet's queue: once it has recorded the key, a release here wakes
// it, of the lease outside the store or of one in it (the breaker closed),
// as long as this process holds a lease outside the store, or is admitting
// one: counted outside, not yet recorded as held (holdHook keeps it there).
func TestGivenBackForALeaseOutsideTheStoreIsWokenByAReleaseHere(t *testing.T) {
	for _, c := range []struct {
		name               string
		inStore, recording bool
	}{{"outside", false, false}, {"in the store", true, false}, {"in the store, the outside one being admitted", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				st, r, x, got, looks := storeAdmitsAWaiter(t)
				defer r.Close()
				var s *slots.Slot
				var err error
				var d *slots.Slot
				dc, inHold, letGo := make(chan *slots.Slot, 1), make(chan struct{}), make(chan struct{})
				if c.recording {
					r.holdHook = func() {
						r.holdHook = nil
						close(inHold)
						<-letGo
					}
					go func() {
						d, err := r.TryAcquire("k")
						if err != nil {
							t.Error(err)
						}
						dc <- d
					}()
					<-inHold
					r.mu.Lock()
					nd, no := len(r.held.degraded), len(r.held.outside)
					r.mu.Unlock()
					require.Equal(t, [2]int{0, 1}, [2]int{nd, no}, "the lease outside counted, not recorded as held")
				} else {
					d, err = r.TryAcquire("k")
					require.NoError(t, err)
					require.True(t, d.Degraded())
				}
				st.fail.Store(false)
				close(st.gate)
				synctest.Wait() // the waiter, given back, sleeps
				require.Equal(t, 1, *looks)
				released := time.Now()
				if c.inStore {
					x.Release()
				} else {
					d.Release()
				}
				if c.recording {
					close(letGo)
					d = <-dc
					require.True(t, d.Degraded())
				}
				s = admittedAtOnce(t, got, released)
				s.Release()
				if c.inStore {
					d.Release()
				} else {
					x.Release()
				}
			})
		})
	}
}

// storeAdmitsAWaiter makes a Registry of limit 2 on a store whose
// admissions can be made to fail (failingAdmits), holds x, admitted in
// the store, and starts a waiter (got) whose admission the store has
// made (2 of 2) and whose reply it holds back; from then on the store's
// admissions fail. looks counts the waiter's records of a full key
// (fullHook). WithPoll of an hour: a wake-up missed shows as a backoff
// of an hour.
func storeAdmitsAWaiter(t *testing.T, opts ...Option) (st *failingAdmits, r *Registry[string], x *slots.Slot, got chan *slots.Slot, looks *int) {
	t.Helper()
	st = &failingAdmits{Store: memstore.New(), arrived: make(chan struct{}), gate: make(chan struct{})}
	r = New[string](st, 2, append([]Option{WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Hour, time.Hour)}, opts...)...)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	s.Release()
	synctest.Wait()
	x, err = r.TryAcquire("k")
	require.NoError(t, err)
	require.False(t, x.Degraded())
	st.hold.Store(true)
	looks = new(int)
	r.fullHook = func() { *looks++ }
	got = acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
	<-st.arrived // the store admitted the waiter: 2 of 2
	st.fail.Store(true)
	return st, r, x, got, looks
}

// admittedAtOnce returns the Slot of the waiter behind got (acquireIn),
// failing t unless it was admitted at the virtual time since: in these
// tests a wake-up missed shows as a backoff of an hour.
func admittedAtOnce(t *testing.T, got chan *slots.Slot, since time.Time) *slots.Slot {
	t.Helper()
	s := <-got
	if d := time.Since(since); d > time.Minute {
		t.Errorf("the waiter was admitted %v after the release, not at once", d)
	}
	require.NotNil(t, s, "the waiter is admitted")
	return s
}

// A waiter given back for a lease admitted outside the store (see
// TestGivenBackForALeaseOutsideTheStoreIsWokenByAReleaseHere) is not in
// the fleet's queue. Once that lease has gone into the store, carried in
// by another call or put in by the heartbeat, a release here no longer
// wakes it (nothing is outside the store), and the fleet's queue, which
// the release serves, does not know it: it slept out its backoff (here an
// hour) after the release of the other lease on the key. The lease's
// going in wakes it, to ask again, queued in the fleet's queue then; and
// a lease that goes in before the waiter has recorded the key (here while
// its reply is on its way) makes it ask again at once.
func TestGivenBackForALeaseOutsideTheStoreAsksAgainOnceItGoesIn(t *testing.T) {
	for _, how := range []string{"carried in", "renewed", "carried in before the waiter was given back"} {
		t.Run(how, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				st, r, x, got, looks := storeAdmitsAWaiter(t, WithLeaseTTL(30*time.Second))
				defer r.Close()
				var s *slots.Slot
				d, err := r.TryAcquire("k") // outside the store: x and d, 2 of 2 here
				require.NoError(t, err)
				require.True(t, d.Degraded())
				st.fail.Store(false)
				goIn := func() {
					switch how {
					case "renewed":
						time.Sleep(10*time.Second + time.Millisecond) // the heartbeat's renewal, at LeaseTTL/3
					default:
						_, err := r.TryAcquire("k") // its call carries d in: x and d, refused
						require.ErrorIs(t, err, slots.ErrLimitReached)
					}
					synctest.Wait()
					require.False(t, r.hasDegraded(), "d is in the store")
				}
				if how == "carried in before the waiter was given back" {
					goIn()
				}
				close(st.gate)
				synctest.Wait() // the waiter, given back, sleeps (or asks again, queued)
				require.Equal(t, 1, *looks, "given back once")
				if how != "carried in before the waiter was given back" {
					goIn()
				}
				r.mu.Lock()
				no := len(r.held.outside)
				r.mu.Unlock()
				require.Zero(t, no, "no lease outside the store: a release here wakes no waiter of its own")
				assert.Equal(t, 1, st.Queued("k"), "the waiter is queued in the fleet's queue")
				released := time.Now()
				x.Release()
				s = admittedAtOnce(t, got, released)
				require.False(t, s.Degraded())
				_, err = r.TryAcquire("k")
				require.ErrorIs(t, err, slots.ErrLimitReached, "the waiter and d hold the key")
				s.Release()
				d.Release()
			})
		})
	}
}
