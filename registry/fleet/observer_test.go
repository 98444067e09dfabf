package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

type requestKey struct{}

// The fleet's Observer hears each admission once, as the fleet decided
// it: an Acquire's with the caller's context and its whole wait (here the
// store's queue while another process held the slot), a TryAcquire's
// without a context, refusals with their reason; and each release from the
// local registry, whose own admissions it does not hear.
func TestObserverHearsTheFleetsAdmissions(t *testing.T) {
	ms := memstore.New()
	var obs slotstest.Recorder
	holder := New[string](ms, 1, WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, holder) })
	r := New[string](ms, 1, WithLogger(quiet()), WithObserver(&obs),
		WithLocalOptions(slots.WithObserver(slots.ObserverFunc(func(slots.Event) { t.Error("the local Observer is replaced") }))))
	t.Cleanup(func() { closeWithin(t, r) })

	held, err := holder.TryAcquire("k")
	require.NoError(t, err)
	_, err = r.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached)
	_, err = r.TryAcquire(string(make([]byte, registry.DefaultMaxKeyBytes+1)))
	require.ErrorIs(t, err, registry.ErrInvalidKey)

	ctx := context.WithValue(context.Background(), requestKey{}, "req")
	got := make(chan *slots.Slot, 1)
	go func() {
		s, err := r.Acquire(ctx, "k")
		assert.NoError(t, err)
		got <- s
	}()
	eventually(t, "the waiter queued in the store", func() bool { return ms.Queued("k") == 1 })
	queuedAt := time.Now()
	held.Release()
	waited := time.Since(queuedAt) // at least: it waited from before queuedAt to after the release
	s := <-got
	s.Release()
	assert.False(t, s.Release(), "a second release")

	evs := obs.Events()
	require.Equal(t, []slots.EventKind{slots.EventRejected, slots.EventRejected, slots.EventAcquired,
		slots.EventReleased, slots.EventDoubleRelease}, obs.Kinds())
	assert.ErrorIs(t, evs[0].Err, slots.ErrLimitReached)
	assert.Nil(t, evs[0].Context, "TryAcquire has no context")
	assert.ErrorIs(t, evs[1].Err, registry.ErrInvalidKey)
	assert.Equal(t, "req", evs[2].Context.Value(requestKey{}))
	assert.GreaterOrEqual(t, evs[2].Wait, waited, "the wait in the store's queue")
}

// An Observer that panics on an admission leaves nothing held: the slot,
// which never reaches its caller, is released.
func TestObserverPanicReleases(t *testing.T) {
	ms := memstore.New()
	boom := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventAcquired {
			panic("observer")
		}
	})
	r := New[string](ms, 1, WithLogger(quiet()), WithObserver(boom))
	t.Cleanup(func() { closeWithin(t, r) })
	assert.PanicsWithValue(t, "observer", func() { _, _ = r.TryAcquire("k") })
	assert.Equal(t, 0, r.Local().InFlight("k"), "nothing held locally")
	eventually(t, "the store's lease released", func() bool {
		n, err := r.InFlight(context.Background(), "k")
		return err == nil && n == 0
	})
}

// The events of a slot pair up whatever its path: one the store admitted
// while the local mirror was full (a limit raised there later) has its
// release; one given back before it reached its caller has neither.
func TestObserverEventsPairUp(t *testing.T) {
	ms := memstore.New()
	var obs slotstest.Recorder
	limit := 1
	var mu sync.Mutex
	keys := Keys[string]{Limit: func(string) int { mu.Lock(); defer mu.Unlock(); return limit }}
	r := NewWithKeys(ms, 1, keys, WithLogger(quiet()), WithObserver(&obs))
	t.Cleanup(func() { closeWithin(t, r) })
	a, err := r.TryAcquire("k")
	require.NoError(t, err)
	mu.Lock()
	limit = 2 // the store takes it at once; the local mirror, later
	mu.Unlock()
	b, err := r.TryAcquire("k")
	require.NoError(t, err)
	a.Release()
	b.Release()
	var acquired, released int
	for _, e := range obs.Events() {
		switch e.Kind {
		case slots.EventAcquired:
			acquired++
		case slots.EventReleased:
			released++
		}
	}
	assert.Equal(t, 2, acquired)
	assert.Equal(t, 2, released, "every admitted slot's release is reported")
}

// askingObserver records the contexts its Enabled is asked with, wants
// the Events of traced alone, and panics in Enabled while panics is set.
type askingObserver struct {
	slotstest.Recorder
	traced context.Context
	mu     sync.Mutex
	asked  []context.Context
	panics bool
}

func (a *askingObserver) Enabled(ctx context.Context) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, ctx)
	if a.panics {
		panic("enabled")
	}
	return ctx == a.traced
}

// The fleet asks an Observer with Enabled before each Event, as the
// local owners do: with the caller's context for an Acquire's outcome, and
// nil for a TryAcquire's, a release and a double release. An Enabled that
// panics on an admission keeps nothing; on a release, the slot is freed
// first.
func TestObserverEnabledIsAsked(t *testing.T) {
	ms := memstore.New()
	traced := context.WithValue(context.Background(), requestKey{}, "traced")
	obs := &askingObserver{traced: traced}
	r := New[string](ms, 1, WithLogger(quiet()), WithObserver(obs))
	t.Cleanup(func() { closeWithin(t, r) })

	s, err := r.Acquire(context.Background(), "k") // not wanted
	require.NoError(t, err)
	_, err = r.TryAcquire("k") // asked with nil: not wanted
	require.ErrorIs(t, err, slots.ErrLimitReached)
	s.Release()
	s.Release()                     // a double release, asked with nil
	s, err = r.Acquire(traced, "k") // wanted
	require.NoError(t, err)
	s.Release()

	assert.Equal(t, []slots.EventKind{slots.EventAcquired}, obs.Kinds())
	obs.mu.Lock()
	assert.Equal(t, []context.Context{context.Background(), nil, nil, nil, traced, nil}, obs.asked)
	obs.panics = true
	obs.mu.Unlock()

	assert.PanicsWithValue(t, "enabled", func() { _, _ = r.Acquire(traced, "k") })
	assert.Zero(t, r.Local().InFlight("k"), "the admission Enabled panicked on is released")
	obs.mu.Lock()
	obs.panics = false
	obs.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound if the slot was kept
	defer cancel()
	s, err = r.Acquire(ctx, "k") // once the store has the release
	require.NoError(t, err)
	obs.mu.Lock()
	obs.panics = true
	obs.mu.Unlock()
	assert.PanicsWithValue(t, "enabled", func() { s.Release() })
	assert.Zero(t, r.Local().InFlight("k"), "released before Enabled panicked")
}
