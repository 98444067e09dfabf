package slots_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// collectUntil runs the collector until cond holds (cleanups run on their
// own goroutine after a collection), with a bound instead of a hang.
func collectUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		require.Less(t, i, 500, "the condition never held")
		runtime.GC()
		runtime.Gosched()
	}
}

func TestLimiterLeakDetection(t *testing.T) {
	var logs logSink
	var ev eventCounts
	l := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithLogger(logs.logger()), slots.WithObserver(&ev))

	func() {
		s, err := l.Acquire(context.Background())
		require.NoError(t, err)
		_ = s // dropped here without Release
	}()
	// The report comes after the capacity: wait for the report.
	collectUntil(t, func() bool { return ev.leaked.Load() == 1 })
	assert.Equal(t, 0, l.InFlight())
	assert.Equal(t, uint64(1), l.Stats().Leaked)
	assert.Equal(t, 1, logs.count("dropped without Release"))
	assert.Equal(t, int64(1), ev.released.Load(), "capacity came back")

	kept, err := l.TryAcquire()
	require.NoError(t, err, "the reclaimed capacity is usable")
	for range 5 {
		runtime.GC()
	}
	assert.Equal(t, 1, l.InFlight(), "a slot still referenced is never reclaimed")
	assert.True(t, kept.Release())
	assert.False(t, kept.Release(), "the stand-in counts a double release")
	assert.Equal(t, uint64(1), l.Stats().DoubleReleases)

	func() {
		s, _ := l.TryAcquire()
		s.Release() // released, then dropped: no leak
	}()
	for range 5 {
		runtime.GC()
		runtime.Gosched()
	}
	assert.Equal(t, uint64(1), l.Stats().Leaked, "still only the one leak")
	assert.Equal(t, 0, l.InFlight())
}

func TestLimiterLeakDetectionForWaiters(t *testing.T) {
	l := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithLogger(slog.New(slog.DiscardHandler)))
	first, _ := l.TryAcquire()
	got := make(chan struct{})
	go func() {
		s, err := l.Acquire(context.Background())
		if assert.NoError(t, err) {
			assert.False(t, s.AcquiredAt().IsZero())
			assert.NotZero(t, s.ID())
		}
		close(got) // s is dropped while held
	}()
	for l.Waiting() == 0 {
		runtime.Gosched()
	}
	first.Release()
	<-got
	// The leak is counted as it is found, before its slot is freed.
	collectUntil(t, func() bool { return l.Stats().Leaked == 1 && l.InFlight() == 0 })
}

func TestLimiterLeakSites(t *testing.T) {
	var logs siteSink
	l := slots.NewLimiter(1, slots.WithLeakSites(), slots.WithLogger(slog.New(&logs)))
	func() {
		s, _ := l.TryAcquire() // this line is the site
		_ = s
	}()
	collectUntil(t, func() bool { return logs.site() != "" })
	site := logs.site()
	assert.Contains(t, site, "slots_test.TestLimiterLeakSites")
	assert.Contains(t, site, "leak_test.go:")
	assert.NotContains(t, site, "slots.(*Limiter)", "the library's own frames are skipped")
}

// siteSink keeps the acquired_at attribute of the last record.
type siteSink struct {
	mu sync.Mutex
	at string
}

func (s *siteSink) site() string                             { s.mu.Lock(); defer s.mu.Unlock(); return s.at }
func (s *siteSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *siteSink) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "acquired_at" {
			s.mu.Lock()
			s.at = a.Value.String()
			s.mu.Unlock()
		}
		return true
	})
	return nil
}
func (s *siteSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *siteSink) WithGroup(string) slog.Handler      { return s }

// TestTransportLeakWithLiveContext: a caller that drops a response body
// under a context that is still alive leaks its slot; the context watch must
// not keep the Slot reachable, or the leak would never be found.
func TestTransportLeakWithLiveContext(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a body nobody reads") }))
	t.Cleanup(up.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	var ev eventCounts
	lim := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithObserver(&ev), slots.WithLogger(slog.New(slog.DiscardHandler)))
	client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_ = resp // dropped: neither read nor closed
	}()
	collectUntil(t, func() bool { return ev.leaked.Load() == 1 })
	assert.Equal(t, 0, lim.InFlight())
}
