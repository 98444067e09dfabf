package sweep_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
)

// warnings counts the warnings logged.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	w.msgs = append(w.msgs, r.Message)
	w.mu.Unlock()
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }
func (w *warnings) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.msgs)
}

func TestSweepReportsLongHoldsOnce(t *testing.T) {
	mock := clock.NewMock()
	reg := registry.New[string](8, slots.WithClock(mock))
	m := sweep.New(reg, sweep.WithClock(mock), sweep.WithThreshold(30*time.Minute), sweep.WithInterval(time.Hour))
	defer m.Stop()

	long, _ := reg.TryAcquire("org-a/glm-5")
	multi, _ := reg.TryAcquireAll("zai", "zai/glm-5")
	for i := range 50 { // many sweeps, short holds come and go
		s, _ := reg.TryAcquire("org-b/glm-4")
		mock.Add(time.Minute)
		rep := m.Sweep(mock.Now())
		s.Release()
		switch {
		case i < 29:
			assert.Empty(t, rep.LongHeld, "minute %d: nothing is long-held yet", i+1)
		case i == 29:
			require.Len(t, rep.NewlyLongHeld, 2, "at 30 minutes: reported, the multi-key slot once")
			ids := []uint64{rep.NewlyLongHeld[0].ID, rep.NewlyLongHeld[1].ID}
			assert.ElementsMatch(t, []uint64{long.ID(), multi.ID()}, ids)
			assert.Len(t, rep.LongHeld, 3, "the multi-key slot is listed under each key")
		default:
			assert.Empty(t, rep.NewlyLongHeld, "minute %d: never reported again", i+1)
			assert.Len(t, rep.LongHeld, 3)
		}
		assert.Equal(t, 4, rep.InUse)
		assert.Equal(t, 4, rep.Keys)
		assert.Equal(t, 1, rep.MaxPerKey)
	}
	long.Release()
	multi.Release()
	rep := m.Sweep(mock.Now())
	assert.Zero(t, rep.InUse)
	assert.Empty(t, rep.LongHeld)
	assert.Equal(t, 0, reg.Keys(), "a sweep never frees a slot, and leaves nothing behind")
}

func TestSweepBusiestKey(t *testing.T) {
	reg := registry.New[string](8)
	m := sweep.New(reg)
	defer m.Stop()
	var held []*slots.Slot
	for _, k := range []string{"a", "b", "b", "b", "c"} {
		s, _ := reg.TryAcquire(k)
		held = append(held, s)
	}
	rep := m.Sweep(time.Now())
	assert.Equal(t, "b", rep.BusiestKey)
	assert.Equal(t, 3, rep.MaxPerKey)
	assert.Equal(t, 5, rep.InUse)
	assert.Equal(t, 5, rep.Units)
	for _, s := range held {
		s.Release()
	}
}

// Under weights the busiest key is the one holding the most units, as
// Registry.InFlight counts them, and Units is what Stats.InFlight counts;
// also for a Limiter's Monitor.
func TestSweepWeighted(t *testing.T) {
	reg := registry.New[string](10)
	m := sweep.New(reg)
	defer m.Stop()
	heavy, err := reg.TryAcquireN("a", 8)
	require.NoError(t, err)
	defer heavy.Release()
	for range 2 {
		s, err := reg.TryAcquire("b")
		require.NoError(t, err)
		defer s.Release()
	}
	rep := m.Sweep(time.Now())
	assert.Equal(t, "a", rep.BusiestKey)
	assert.Equal(t, reg.InFlight("a"), rep.MaxPerKey)
	assert.Equal(t, 3, rep.InUse)
	assert.Equal(t, reg.Stats().InFlight, rep.Units)

	lim := slots.NewLimiter(4)
	lm := sweep.NewForLimiter(lim)
	defer lm.Stop()
	s, err := lim.TryAcquireN(3)
	require.NoError(t, err)
	defer s.Release()
	assert.Equal(t, 3, lm.Sweep(time.Now()).Units)
}

// TestMonitorTicks: the monitor sweeps every interval (not at start), warns
// once per long-held slot, feeds the observer, and survives its panics.
func TestMonitorTicks(t *testing.T) {
	mock := clock.NewMock()
	lim := slots.NewLimiter(4, slots.WithClock(mock))
	var w warnings
	ticks := make(chan sweep.Tick, 16)
	var calls atomic.Int32
	obs := sweep.ObserverFunc(func(tk sweep.Tick) {
		if calls.Add(1) == 1 {
			panic("observer bug")
		}
		ticks <- tk
	})
	m := sweep.NewForLimiter(lim, sweep.WithClock(mock), sweep.WithInterval(time.Minute),
		sweep.WithThreshold(90*time.Second), sweep.WithObserver(obs), sweep.WithLogger(slog.New(&w)))
	defer m.Stop()

	s, _ := lim.TryAcquire()
	mock.Add(time.Minute) // first tick: the observer panics
	waitUntil(t, func() bool { return calls.Load() == 1 })
	assert.Equal(t, 1, w.count(), "the panic is logged")

	mock.Add(time.Minute) // second tick: 2 min held, over the threshold
	tk := <-ticks
	assert.Equal(t, sweep.Tick{InUse: 1, Units: 1, Keys: 1, MaxPerKey: 1, OverThreshold: 1, NewlyOver: 1}, tk)
	mock.Add(time.Minute)
	tk = <-ticks
	assert.Equal(t, 0, tk.NewlyOver)
	assert.Equal(t, 2, w.count(), "one panic, one long-held warning, nothing more")
	s.Release()
	mock.Add(time.Minute)
	assert.Equal(t, sweep.Tick{}, <-ticks)
	m.Stop()
	require.Len(t, ticks, 1, "told it ended, before Stop returned")
	assert.Equal(t, sweep.Tick{Stopped: true}, <-ticks)
}

// TestMonitorEndingIsTold: a Monitor whose source is collected tells its
// Observer it has ended, as Stop does, so that a figure it fed does not
// stay at its last value.
func TestMonitorEndingIsTold(t *testing.T) {
	mock := clock.NewMock()
	ticks := make(chan sweep.Tick, 1)
	obs := sweep.ObserverFunc(func(tk sweep.Tick) {
		select {
		case ticks <- tk:
		default: // keep the last only
			<-ticks
			ticks <- tk
		}
	})
	m := func() *sweep.Monitor[string] {
		return sweep.New(registry.New[string](1), sweep.WithClock(mock), sweep.WithInterval(time.Second), sweep.WithObserver(obs))
	}()
	for i := 0; ; i++ {
		runtime.GC()
		mock.Add(time.Second)
		select {
		case <-m.Done():
			require.Len(t, ticks, 1, "told it ended, before Done was closed")
			assert.Equal(t, sweep.Tick{Stopped: true}, <-ticks)
			return
		default:
		}
		require.Less(t, i, 1000, "the monitor kept running after its registry was dropped")
		runtime.Gosched()
	}
}

// TestMonitorEndsWithItsRegistry: the monitor keeps only a weak pointer, so
// a registry nobody uses is collected and the monitor's goroutine ends.
func TestMonitorEndsWithItsRegistry(t *testing.T) {
	mock := clock.NewMock()
	m := func() *sweep.Monitor[string] {
		reg := registry.New[string](1)
		s, _ := reg.TryAcquire("k")
		s.Release()
		return sweep.New(reg, sweep.WithClock(mock), sweep.WithInterval(time.Second))
	}()
	for i := 0; ; i++ {
		runtime.GC()
		mock.Add(time.Second)
		select {
		case <-m.Done():
			m.Stop() // still fine afterwards
			return
		default:
		}
		require.Less(t, i, 1000, "the monitor kept running after its registry was dropped")
		runtime.Gosched()
	}
}

func TestMonitorStop(t *testing.T) {
	reg := registry.New[string](1)
	m := sweep.New(reg)
	m.Stop()
	m.Stop()
	<-m.Done()
	runtime.KeepAlive(reg)
}

func TestOptionsRejectNonsense(t *testing.T) {
	assert.PanicsWithValue(t, "sweep: WithInterval(0s): the interval must be positive", func() { sweep.WithInterval(0) })
	assert.PanicsWithValue(t, "sweep: WithThreshold(-1s): the threshold must be positive", func() { sweep.WithThreshold(-time.Second) })
}

// waitUntil spins (yielding) until cond holds, with a generous bound.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "timed out")
		runtime.Gosched()
	}
}

// TestSweepTimesOutOfOrder: a manual Sweep may run between a tick and that
// tick's sweep, so sweeps can see their times out of order; a slot is still
// reported once.
func TestSweepTimesOutOfOrder(t *testing.T) {
	mock := clock.NewMock()
	reg := registry.New[string](1, slots.WithClock(mock))
	m := sweep.New(reg, sweep.WithClock(mock), sweep.WithThreshold(time.Minute), sweep.WithInterval(time.Hour))
	defer m.Stop()
	s, _ := reg.TryAcquire("k")
	t0 := mock.Now()
	var newly []int
	for _, at := range []time.Duration{2 * time.Minute, 30 * time.Second, 3 * time.Minute} {
		newly = append(newly, len(m.Sweep(t0.Add(at)).NewlyLongHeld))
	}
	assert.Equal(t, []int{1, 0, 0}, newly)
	s.Release()
}

// WithClock(nil) is the real clock, as slots.WithClock(nil) is and as
// WithLogger(nil) is the default logger: neither a Monitor nor a Handler
// panics on it.
func TestNilClockIsTheRealClock(t *testing.T) {
	reg := registry.New[string](1)
	s, err := reg.TryAcquire("org-a")
	require.NoError(t, err)
	defer s.Release()
	var m *sweep.Monitor[string]
	require.NotPanics(t, func() { m = sweep.New(reg, sweep.WithClock(nil)) })
	assert.Equal(t, 1, m.Sweep(time.Now()).InUse)
	m.Stop()
	rec := httptest.NewRecorder()
	require.NotPanics(t, func() {
		sweep.Handler(reg, sweep.WithClock(nil)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	})
	assert.Equal(t, http.StatusOK, rec.Code)
}
