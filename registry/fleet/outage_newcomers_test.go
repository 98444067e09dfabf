package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// acquireIn runs acquire in a goroutine; its Slot (nil: it failed) comes
// on the channel returned.
func acquireIn(acquire func() (*slots.Slot, error)) chan *slots.Slot {
	got := make(chan *slots.Slot, 1)
	go func() {
		s, err := acquire()
		if err != nil {
			s = nil
		}
		got <- s
	}()
	return got
}

// A waiter that has not been told a key is full (it holds back its keys
// from enqueue until its first reply) is not waiting for room: here it is
// being admitted under the local registry, and holds one unit of two. A
// TryAcquire made then has room beside it, and is refused.
func TestOutageNewcomerNotRefusedByAWaiterBeingAdmitted(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		obs, armed, in, out := stopAt(slots.EventAcquired)
		ms := memstore.New()
		r := New[string](ms, 2, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(5*time.Second, 5*time.Second),
			WithLocalOptions(slots.WithObserver(obs)))
		defer r.Close()
		ms.Kill()
		s, err := r.TryAcquire("k") // its call fails: the breaker opens
		require.NoError(t, err)
		s.Release()
		require.True(t, r.Stats().BreakerOpen)
		armed.Store(true)
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
		<-in // the waiter holds its local mirror: one unit of two
		require.Equal(t, 1, r.Local().InFlight("k"))
		s, err = r.TryAcquire("k")
		close(out)
		if assert.NoError(t, err, "room for both: the waiter took one unit of two") {
			s.Release()
		}
		if w := <-got; assert.NotNil(t, w) {
			w.Release()
		}
	})
}

// A lease the store admitted, released after the store stopped answering
// but before the breaker opened (WithBreaker's threshold above 1), wakes
// no waiter: the waiter, told full under the local registry, sleeps out
// its backoff (WithPoll) while every newcomer is refused for it, the room
// idle.
func TestOutageRoomNotIdleForASleepingWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(5*time.Second, 5*time.Second))
		defer r.Close()
		held, err := r.TryAcquire("k") // in the store
		require.NoError(t, err)
		ms.Kill()
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
		synctest.Wait()
		require.Equal(t, 1, r.Stats().Waiting)
		held.Release()
		synctest.Wait()
		start, refused := time.Now(), 0
		var w *slots.Slot
		for w == nil && time.Since(start) < 10*time.Second {
			s, err := r.TryAcquire("k")
			if err == nil {
				t.Errorf("a newcomer passed the waiter")
				s.Release()
			} else {
				refused++
			}
			synctest.Wait()
			select {
			case w = <-got:
				require.NotNil(t, w)
			default:
				time.Sleep(100 * time.Millisecond)
			}
		}
		if w != nil {
			w.Release()
		}
		assert.Less(t, time.Since(start), 200*time.Millisecond,
			"the room stood idle while %d newcomers were refused for the waiter", refused)
	})
}

// A waiter queued in the fleet's queue (it holds back nothing here) when
// the store stops answering: the holder's release wakes nobody, and a
// newcomer decided under the local registry takes the room ahead of it.
func TestOutageNewcomerDoesNotPassAWaiterQueuedInTheStore(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(5*time.Second, 5*time.Second))
		defer r.Close()
		held, err := r.TryAcquire("k")
		require.NoError(t, err)
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
		synctest.Wait()
		require.Equal(t, 1, ms.Queued("k"))
		ms.Kill()
		held.Release()
		synctest.Wait()
		s, err := r.TryAcquire("k")
		if err == nil {
			t.Errorf("a TryAcquire passed the waiter queued in the store (breaker open: %v)", r.Stats().BreakerOpen)
			s.Release()
		}
		ms.Restart()
		if w := <-got; w != nil {
			w.Release()
		}
	})
}

// A heavy waiter (AcquireN) under the local registry while the store
// cannot be reached: TryAcquire newcomers of one unit take each unit
// freed (a newcomer that does not wait passes no heavy waiter, in the
// store), and it waits on.
func TestOutageHeavyWaiterNotStarvedByNewcomers(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 3, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(time.Second, time.Second))
		defer r.Close()
		ms.Kill()
		var held []*slots.Slot
		for range 3 {
			s, err := r.TryAcquire("k")
			require.NoError(t, err)
			held = append(held, s)
		}
		require.True(t, r.Stats().BreakerOpen)
		got := acquireIn(func() (*slots.Slot, error) { return r.AcquireN(context.Background(), "k", 3) })
		synctest.Wait()
		require.Equal(t, 1, r.Stats().Waiting)
		passed := 0
		for i := range 30 {
			held[i%3].Release()
			s, err := r.TryAcquire("k")
			var le *slots.LimitError
			if errors.As(err, &le) {
				held[i%3] = nil
				break
			}
			require.NoError(t, err)
			held[i%3] = s
			passed++
			time.Sleep(time.Second)
		}
		assert.Zero(t, passed, "newcomers of one unit passed the heavy waiter")
		for _, s := range held {
			if s != nil {
				s.Release()
			}
		}
		if w := <-got; w != nil {
			w.Release()
		}
	})
}

// stopAt returns an Observer (of a local registry) that, once armed, stops
// the next Event of kind k in its owner's call: it sends on in and waits
// for out (closed by the test) before the call goes on.
func stopAt(k slots.EventKind) (obs slots.Observer, armed *atomic.Bool, in, out chan struct{}) {
	armed = new(atomic.Bool)
	in, out = make(chan struct{}), make(chan struct{})
	return slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == k && armed.CompareAndSwap(true, false) {
			in <- struct{}{}
			<-out
		}
	}), armed, in, out
}

// A waiter queued in the fleet's queue when the breaker opens is put back
// in this process's order (backInLine), in line for its keys as it was in
// the fleet's: a newcomer that comes before its next try leaves the room
// to it. It was put back holding its keys, but not in line (inLine), and
// the newcomer, decided under the local registry, took the one unit the
// waiter was woken for. Its next try is held here by its call to the
// store, made within a claim window as a queued waiter's is, and kept
// there (failingAdmits) until the newcomer has been decided: one that
// comes once the waiters are woken, and one that comes while the
// breaker's opening is logged (a Logger's handler may take its time),
// which was logged before the waiters were put back.
func TestOutageNewcomerLeavesTheRoomToAWaiterPutBackInLine(t *testing.T) {
	for _, whileLogged := range []bool{false, true} {
		t.Run(fmt.Sprintf("whileLogged=%v", whileLogged), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				st := &failingAdmits{Store: memstore.New(), arrived: make(chan struct{}), gate: make(chan struct{})}
				var r *Registry[string]
				tried := false
				newcomer := func() {
					tried = true
					// Maybe in the goroutine of the call that failed: no require.
					assert.Zero(t, r.Local().InFlight("k"), "the key's room is free under the local registry")
					s, err := r.TryAcquire("k")
					if err == nil {
						t.Errorf("a newcomer took the room ahead of the waiter put back in line")
						s.Release()
						return
					}
					assert.ErrorIs(t, err, slots.ErrLimitReached)
				}
				var armed atomic.Bool
				logged := onLog{match: "breaker open", hook: func() {
					if armed.CompareAndSwap(true, false) {
						newcomer()
					}
				}}
				r = New[string](st, 1, WithLogger(slog.New(logged)), WithBreaker(1, time.Hour), WithPoll(time.Hour, time.Hour))
				defer r.Close()
				other := New[string](st.Store, 1, WithLogger(quiet())) // another process, which holds the key's unit
				defer other.Close()
				held, err := other.TryAcquire("k")
				require.NoError(t, err)
				got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
				synctest.Wait()
				require.Equal(t, 1, st.Queued("k"))
				st.hold.Store(true)
				<-st.arrived // the waiter asks again, queued: its place is kept
				st.fail.Store(true)
				armed.Store(whileLogged)
				o, err := r.TryAcquire("other") // its call fails: the breaker opens
				require.NoError(t, err)
				require.True(t, r.Stats().BreakerOpen)
				if !whileLogged {
					newcomer()
				}
				require.True(t, tried)
				close(st.gate)
				w := <-got
				require.NotNil(t, w, "the waiter is admitted under the local registry")
				require.True(t, w.Degraded())
				_, err = r.TryAcquire("k")
				require.ErrorIs(t, err, slots.ErrLimitReached, "the waiter holds the one unit")
				w.Release()
				o.Release()
				st.fail.Store(false)
				held.Release()
			})
		})
	}
}

// onLog calls hook for each log record whose message holds match.
type onLog struct {
	match string
	hook  func()
}

func (h onLog) Enabled(context.Context, slog.Level) bool { return true }
func (h onLog) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, h.match) {
		h.hook()
	}
	return nil
}
func (h onLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onLog) WithGroup(string) slog.Handler      { return h }

// A waiter put back in line by the breaker's opening (backInLine) is not
// in line for a key full under the local registry, even if an earlier
// outage told it one was: a waiter behind it, on a key free here, waits
// its turn within WithMaxQueue(1) rather than being refused ErrQueueFull
// at once, as it was while the flag of the earlier outage was kept.
func TestAWaiterPutBackInLineDoesNotFillTheLocalQueue(t *testing.T) {
	for _, earlier := range []bool{false, true} {
		t.Run(map[bool]string{false: "fresh", true: "afterAnEarlierOutage"}[earlier], func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				st := &failingAdmits{Store: memstore.New(), arrived: make(chan struct{}), gate: make(chan struct{})}
				r := New[string](st, 1, WithLogger(quiet()), WithBreaker(1, time.Second), WithUnavailable(FallbackLocal),
					WithLocalOptions(slots.WithMaxQueue(1)))
				defer r.Close()
				h, err := r.TryAcquire("k")
				require.NoError(t, err)
				if earlier {
					st.fail.Store(true)
				}
				got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
				synctest.Wait()
				if earlier {
					require.True(t, r.Stats().BreakerOpen)
					st.fail.Store(false)
					time.Sleep(3 * time.Second) // past the breaker's probe interval: it closes, and v asks again
					synctest.Wait()
					require.False(t, r.Stats().BreakerOpen)
				}
				require.Equal(t, 1, st.Queued("k"), "v is queued in the fleet's queue")
				st.hold.Store(true)
				<-st.arrived // v asks again within its claim window: held
				st.fail.Store(true)
				o, err := r.TryAcquire("other")
				require.NoError(t, err)
				defer o.Release()
				require.True(t, r.Stats().BreakerOpen)
				h.Release()
				require.Zero(t, r.Local().InFlight("k"))
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				berr := make(chan error, 1)
				go func() {
					s, err := r.Acquire(ctx, "k")
					if err == nil {
						s.Release()
					}
					berr <- err
				}()
				synctest.Wait()
				select {
				case err := <-berr:
					t.Errorf("B, a waiter behind v on a key free under the local registry, refused at once: %v", err)
				default:
				}
				close(st.gate)
				w := <-got
				require.NotNil(t, w)
				w.Release()
				cancel()
				synctest.Wait()
			})
		})
	}
}

// A newcomer whose own call to the store fails while the breaker stays
// closed (WithBreaker's threshold above one) is decided under the local
// registry, and leaves the room to this process's waiter queued in the
// fleet's queue on its key, as it does once the breaker opens (see
// TestOutageNewcomerLeavesTheRoomToAWaiterPutBackInLine): nothing put
// that waiter in line here before the breaker opened, and the newcomer
// took the unit free here ahead of it (the key's unit in the fleet held by
// another process). The waiter, woken by the newcomer's refusal, asks
// again: its call fails too, and it takes the unit.
func TestNewcomerWhoseCallFailedLeavesTheRoomToAWaiterQueuedInTheStore(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		st := &failingAdmits{Store: memstore.New(), arrived: make(chan struct{}), gate: make(chan struct{})}
		r := New[string](st, 1, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Hour, time.Hour))
		defer r.Close()
		other := New[string](st.Store, 1, WithLogger(quiet())) // another process, which holds the key's unit
		defer other.Close()
		held, err := other.TryAcquire("k")
		require.NoError(t, err)
		defer held.Release()
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
		synctest.Wait()
		require.Equal(t, 1, st.Queued("k"), "the waiter is queued in the fleet's queue")
		st.fail.Store(true)
		refused := time.Now()
		s, err := r.TryAcquire("k") // its call fails: decided under the local registry
		require.False(t, r.Stats().BreakerOpen)
		if err == nil {
			t.Errorf("a newcomer whose call failed took the room ahead of the waiter queued in the store")
			s.Release()
		} else {
			assert.ErrorIs(t, err, slots.ErrLimitReached)
		}
		w := admittedAtOnce(t, got, refused)
		assert.Less(t, time.Since(refused), 100*time.Millisecond, "woken by the refusal, not at its next ask")
		require.True(t, w.Degraded(), "admitted under the local registry")
		_, err = r.TryAcquire("k")
		require.ErrorIs(t, err, slots.ErrLimitReached, "the waiter holds the one unit")
		require.False(t, r.Stats().BreakerOpen)
		w.Release()
		st.fail.Store(false)
	})
}

// A waiter that held a place in the fleet's queue and is being admitted,
// by the store (its grant claimed) or under the local registry (its call
// failed), holds its local unit already: a newcomer whose call fails then
// has room beside it (one unit of two), and is not refused for it, as
// for a waiter not told a key is full (see
// TestOutageNewcomerNotRefusedByAWaiterBeingAdmitted). holdHook keeps the
// waiter between its local admission and its record while the newcomer is
// decided.
func TestNewcomerWhoseCallFailedNotRefusedByAQueuedWaiterBeingAdmitted(t *testing.T) {
	for _, how := range []string{"by the store", "under the local registry"} {
		t.Run(how, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				st := &failingAdmits{Store: memstore.New(), arrived: make(chan struct{}), gate: make(chan struct{})}
				r := New[string](st, 2, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Hour, time.Hour))
				defer r.Close()
				other := New[string](st.Store, 2, WithLogger(quiet())) // another process, which holds the key's units
				defer other.Close()
				a, err := other.TryAcquire("k")
				require.NoError(t, err)
				b, err := other.TryAcquire("k")
				require.NoError(t, err)
				defer b.Release()
				got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(context.Background(), "k") })
				synctest.Wait()
				require.Equal(t, 1, st.Queued("k"), "the waiter is queued in the fleet's queue")
				inHold, letGo := make(chan struct{}), make(chan struct{})
				r.holdHook = func() {
					r.holdHook = nil
					close(inHold)
					<-letGo
				}
				if how == "by the store" {
					a.Release() // the fleet's queue grants the waiter the unit
				} else {
					defer a.Release()
					st.fail.Store(true) // the waiter's next ask, within a claim window, fails
				}
				<-inHold
				require.Equal(t, 1, r.localHeld("k"), "the waiter holds one unit of two")
				st.fail.Store(true)
				s, err := r.TryAcquire("k")
				close(letGo)
				if assert.NoError(t, err, "room for both: the waiter took one unit of two") {
					assert.True(t, s.Degraded())
					s.Release()
				}
				if w := <-got; assert.NotNil(t, w) {
					assert.Equal(t, how != "by the store", w.Degraded())
					w.Release()
				}
				st.fail.Store(false)
			})
		})
	}
}
