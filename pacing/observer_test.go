package pacing_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// TestGateReportsToItsObserver: a Gate reports what a Limiter reports, so
// that a provider's queue can be measured like any other cap.
func TestGateReportsToItsObserver(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		obs := &slotstest.Recorder{}
		g, err := pacing.NewGate("zai", pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1}, slots.WithObserver(obs))
		require.NoError(t, err)
		first, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)

		waiter := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		_, err = g.Acquire(context.Background(), "m") // the queue of one is full
		require.ErrorIs(t, err, slots.ErrQueueFull)

		time.Sleep(3 * time.Second) // the first holds for 3 s of fake time
		first.Slot.Release()
		second := <-waiter
		require.NoError(t, second.err)
		second.g.Slot.Release()
		assert.False(t, second.g.Slot.Release(), "a second release frees nothing")

		assert.Equal(t, []slots.EventKind{
			slots.EventAcquired, slots.EventRejected, slots.EventReleased,
			slots.EventAcquired, slots.EventReleased, slots.EventDoubleRelease,
		}, obs.Kinds())
		seen := obs.Events()
		assert.Equal(t, 3*time.Second, seen[2].Hold, "the first held for 3 s")
		assert.Equal(t, 3*time.Second, seen[3].Wait, "the second waited 3 s")
		assert.True(t, errors.Is(seen[1].Err, slots.ErrQueueFull))
		assert.Equal(t, uint64(1), g.Status().DoubleReleases)
	})
}

type requestKey struct{}

// TestGateEventsCarryTheCallersContext: a Gate's admissions, waited for or
// not, admitted or not, tell the Observer the caller's context (for a
// span on it), and how long a caller turned away waited.
func TestGateEventsCarryTheCallersContext(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		obs := &slotstest.Recorder{}
		g, err := pacing.NewGate("zai", pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 2000}, slots.WithObserver(obs))
		require.NoError(t, err)
		defer g.Close()
		ctx := context.WithValue(context.Background(), requestKey{}, "req")
		first, err := g.Acquire(ctx, "m")
		require.NoError(t, err)
		_, err = g.Acquire(ctx, "m")
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(500*time.Millisecond, cancel)
		_, err = g.Acquire(cctx, "m")
		require.ErrorIs(t, err, context.Canceled)
		first.Slot.Release()

		require.Equal(t, []slots.EventKind{slots.EventAcquired, slots.EventRejected, slots.EventRejected, slots.EventReleased}, obs.Kinds())
		seen := obs.Events()
		for _, e := range seen[:3] {
			assert.Equal(t, "req", e.Context.Value(requestKey{}))
		}
		assert.Zero(t, seen[0].Wait)
		assert.Equal(t, 2*time.Second, seen[1].Wait, "timed out after its wait")
		assert.Equal(t, 500*time.Millisecond, seen[2].Wait, "gave up after its wait")
		assert.Nil(t, seen[3].Context, "a release has no context")
	})
}

// TestGateOptionsAreTyped: the waits of a Gate are its Config's, so a
// wait option of package slots is not a GateOption: passing one to NewGate
// does not compile. Only the options every owner takes are.
func TestGateOptionsAreTyped(t *testing.T) {
	gateOption := reflect.TypeFor[pacing.GateOption]()
	for name, o := range map[string]slots.Option{
		"max wait":   slots.WithMaxWait(time.Second),
		"max queue":  slots.WithMaxQueue(3),
		"per-flow":   slots.WithMaxQueuePerFlow(1),
		"fail open":  slots.WithFailOpen(),
		"share":      slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}),
		"leaks":      slots.WithLeakDetection(),
		"leak sites": slots.WithLeakSites(),
	} {
		assert.False(t, reflect.TypeOf(o).Implements(gateOption), "%s is no GateOption", name)
	}
	for name, o := range map[string]slots.Option{
		"clock":    slots.WithClock(clock.NewMock()),
		"logger":   slots.WithLogger(nil),
		"observer": slots.WithObserver(nil),
	} {
		assert.True(t, reflect.TypeOf(o).Implements(gateOption), "%s is a GateOption", name)
	}
	_, err := pacing.NewGate("zai", pacing.Config{}, slots.WithLogger(nil), nil, slots.WithObserver(nil))
	assert.NoError(t, err, "a nil option is ignored")
}

// TestGateEventDurationsAreNeverNegative: on the real clock, a hold's and a
// bypass's durations are measured from the Gate's exact readings to
// exact ones, never to a coarser reading that may lag them.
func TestGateEventDurationsAreNeverNegative(t *testing.T) {
	var mu sync.Mutex
	var bad []slots.Event
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Hold < 0 || e.Wait < 0 {
			mu.Lock()
			bad = append(bad, e)
			mu.Unlock()
		}
	})
	g, err := pacing.NewGate("zai", pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 1, OnWaitTimeout: pacing.Proceed},
		slots.WithObserver(obs))
	require.NoError(t, err)
	for range 200 {
		gt, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		bypass, err := g.Acquire(context.Background(), "m") // waits 1 ms, then proceeds
		require.NoError(t, err)
		require.True(t, bypass.Slot.Bypassed())
		bypass.Slot.Release()
		gt.Slot.Release()
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Zero(t, len(bad), "events with a negative duration; the first: %v", bad[:min(len(bad), 3)])
}

// TestGateReportsEveryFailure: every attempt is reported once, as acquired,
// rejected or bypassed, whatever ends it: a nil context, a Gate closed
// before the attempt or while it waits.
func TestGateReportsEveryFailure(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		obs := &slotstest.Recorder{}
		g, err := pacing.NewGate("zai", pacing.Config{MaxConcurrentRequests: 1}, slots.WithObserver(obs))
		require.NoError(t, err)
		held, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		_, err = g.Acquire(nil, "m") //nolint:staticcheck
		require.ErrorIs(t, err, slots.ErrNilContext)
		waiting := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		g.Close()
		require.ErrorIs(t, (<-waiting).err, pacing.ErrGateClosed)
		_, err = g.Acquire(context.Background(), "m")
		require.ErrorIs(t, err, pacing.ErrGateClosed)
		held.Slot.Release()
		assert.Equal(t, []slots.EventKind{
			slots.EventAcquired, slots.EventRejected, slots.EventRejected, slots.EventRejected, slots.EventReleased,
		}, obs.Kinds())
	})
}

// TestGateRetryAfterWithoutACap: a Gate that only paces (no concurrency
// cap) tells a refused caller when the next start may go, not when its
// holders will end.
func TestGateRetryAfterWithoutACap(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g, err := pacing.NewGate("zai", pacing.Config{MinIntervalMS: 100, MaxQueue: 1})
		require.NoError(t, err)
		defer g.Close()
		long, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		time.Sleep(30 * time.Second)
		long.Slot.Release() // a hold of 30 s: the mean
		held, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		waiter := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		_, err = g.Acquire(context.Background(), "m") // the queue of one is full
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.LessOrEqual(t, le.RetryAfter, time.Second, "the next starts are 100 ms apart")
		w := <-waiter
		require.NoError(t, w.err)
		w.g.Slot.Release()
		held.Slot.Release()
	})
}

// declineAll is an Observer with Enabled that wants no Event, and counts
// the questions.
type declineAll struct {
	slotstest.Recorder
	asked atomic.Int64
}

func (d *declineAll) Enabled(context.Context) bool { d.asked.Add(1); return false }

// TestGateAsksEnabled: a Gate asks an Observer with Enabled before each
// Event, as a Limiter does, and tells it none it declines.
func TestGateAsksEnabled(t *testing.T) {
	obs := &declineAll{}
	g, err := pacing.NewGate("zai", pacing.Config{MaxConcurrentRequests: 1}, slots.WithObserver(obs))
	require.NoError(t, err)
	held, err := g.Acquire(context.Background(), "m")
	require.NoError(t, err)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = g.Acquire(ended, "m")
	require.ErrorIs(t, err, context.Canceled)
	held.Slot.Release()
	held.Slot.Release()
	assert.Equal(t, int64(4), obs.asked.Load(), "an admission, a refusal, a release, a double release")
	assert.Empty(t, obs.Kinds())
}
