package registry_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// An Observer that panics on an admission does not keep the capacity: the
// Slot never reaches its caller, so it is released.
func TestObserverPanicOnAdmissionKeepsNothing(t *testing.T) {
	var armed atomic.Bool
	obs := slots.ObserverFunc(func(e slots.Event) {
		if armed.Load() && e.Kind == slots.EventAcquired {
			panic("observer")
		}
	})
	reg := registry.New[string](1, slots.WithObserver(obs))
	armed.Store(true)
	for _, acquire := range []func() (*slots.Slot, error){
		func() (*slots.Slot, error) { return reg.TryAcquire("a") },
		func() (*slots.Slot, error) { return reg.Acquire(context.Background(), "a") },
		func() (*slots.Slot, error) { return reg.AcquireAll(context.Background(), "a", "b") },
	} {
		assert.PanicsWithValue(t, "observer", func() { _, _ = acquire() })
		assert.Zero(t, reg.Keys())
	}
}

// TestObserverNeverUnderLock: releasing a copied multi-key slot is misuse;
// the Observer hears of it with no registry lock held, so it may call back.
func TestObserverNeverUnderLock(t *testing.T) {
	var reg *registry.Registry[string]
	var calledBack atomic.Int32
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind != slots.EventDoubleRelease {
			return
		}
		done := make(chan struct{})
		go func() { reg.Stats(); close(done) }()
		select {
		case <-done:
			calledBack.Add(1)
		case <-time.After(5 * time.Second):
			t.Error("the Observer was called with registry locks held")
		}
	})
	reg = registry.New[string](1, slots.WithObserver(obs), slots.WithLogger(quiet))
	m, err := reg.TryAcquireAll("p", "q")
	require.NoError(t, err)
	copySlot(m).Release()
	assert.Equal(t, int32(1), calledBack.Load())
	assert.Equal(t, 1, reg.InFlight("p"), "the copy freed nothing")
	m.Release()
	assert.Equal(t, 0, reg.Keys())
}

func TestEveryAttemptEndsInOneEvent(t *testing.T) {
	var rejected atomic.Int32
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventRejected {
			rejected.Add(1)
		}
	})
	reg := registry.New[string](1, slots.WithObserver(obs))
	_, err := reg.AcquireAll(context.Background())
	assert.ErrorIs(t, err, registry.ErrNoKeys)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = reg.Acquire(ctx, "k")
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, int32(2), rejected.Load())

	reg.SetLimit(strings.Repeat("x", registry.DefaultMaxKeyBytes+1), 3)
	reg.ClearLimit(strings.Repeat("x", registry.DefaultMaxKeyBytes+1))
	assert.Equal(t, int32(2), rejected.Load(), "limits set on a bad key are no rejections")
	assert.Equal(t, uint64(0), reg.Stats().InvalidKeys)
}

type requestKey struct{}

// One key or several, an admission's events carry the context its caller
// passed (for a span on it), and a rejection after a wait says how long
// the caller waited; TryAcquire's carry none.
func TestEventsCarryTheCallersContext(t *testing.T) {
	mock := testrig.NewSettingClock()
	var obs slotstest.Recorder
	reg := registry.New[string](1, slots.WithClock(mock), slots.WithObserver(&obs), slots.WithMaxWait(2*time.Second))
	ctx := context.WithValue(context.Background(), requestKey{}, "req")
	held, err := reg.TryAcquire("k")
	require.NoError(t, err)
	for _, acquire := range []func() error{
		func() error { _, err := reg.Acquire(ctx, "k"); return err },
		func() error { _, err := reg.AcquireAll(ctx, "j", "k"); return err },
	} {
		errc := make(chan error, 1)
		go func() { errc <- acquire() }()
		// The clock moves once, when the waiter's timer is set (SettingClock).
		mock.WaitSet(t, 1, 2*time.Second)
		mock.Add(2 * time.Second)
		require.ErrorIs(t, <-errc, slots.ErrWaitTimeout)
	}
	held.Release()
	s, err := reg.AcquireAll(ctx, "j", "k")
	require.NoError(t, err)
	s.Release()

	evs := obs.Events()
	require.Len(t, evs, 6)
	assert.Equal(t, slots.EventAcquired, evs[0].Kind)
	assert.Nil(t, evs[0].Context, "TryAcquire has no context")
	for _, e := range evs[1:3] {
		assert.Equal(t, slots.EventRejected, e.Kind)
		assert.Equal(t, "req", e.Context.Value(requestKey{}))
		assert.Equal(t, 2*time.Second, e.Wait, "timed out after its wait")
	}
	assert.Equal(t, slots.EventReleased, evs[3].Kind)
	assert.Equal(t, slots.EventAcquired, evs[4].Kind)
	assert.Equal(t, "req", evs[4].Context.Value(requestKey{}))
	assert.Nil(t, evs[5].Context, "a release has no context")
}

// The returns told to callers refused on one key spread them over that
// key's slots: those of another key are not pushed back by them, and a
// key that went idle and came back starts afresh.
func TestRetryAftersAreEachKeys(t *testing.T) {
	mock := clock.NewMock()
	reg := registry.New[string](1, slots.WithClock(mock))
	a, err := reg.TryAcquire("a")
	require.NoError(t, err)
	b, err := reg.TryAcquire("b")
	require.NoError(t, err)
	var last time.Duration
	for i := range 3 {
		_, err := reg.TryAcquire("a")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		if i > 0 {
			assert.Greater(t, le.RetryAfter, last, "callers refused together are spread")
		}
		last = le.RetryAfter
	}
	_, err = reg.TryAcquire("b")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Less(t, le.RetryAfter, last, "another key's returns go before none of b's")
	a.Release()
	b.Release()
	a, err = reg.TryAcquire("a")
	require.NoError(t, err)
	_, err = reg.TryAcquire("a")
	require.ErrorAs(t, err, &le)
	assert.Less(t, le.RetryAfter, last, "an idle key's returns told are gone with it")
	a.Release()
}

// An invalid key refused under Acquire carries the caller's context too.
func TestInvalidKeyEventCarriesTheContext(t *testing.T) {
	var got slots.Event
	reg := registry.New[string](1, registry.WithMaxKeyBytes(4), slots.WithObserver(slots.ObserverFunc(func(e slots.Event) { got = e })))
	ctx := context.WithValue(context.Background(), requestKey{}, "req")
	_, err := reg.Acquire(ctx, "much too long")
	require.ErrorIs(t, err, registry.ErrInvalidKey)
	assert.Equal(t, slots.EventRejected, got.Kind)
	assert.Equal(t, "req", got.Context.Value(requestKey{}))
}
