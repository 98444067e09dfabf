package slots_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// A Transport holding a Slot that combines leak-tracked ones (Combine, as
// pacing's Transport makes) keeps none of them reachable under a live
// context: a response dropped unread is found, and its capacity comes
// back. Found by a bug hunt: the watch on the request's context kept it.
func TestTransportLeakOfACombinedSlot(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "a body nobody reads") }))
	t.Cleanup(up.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	var ev eventCounts
	quiet := slots.WithLogger(slog.New(slog.DiscardHandler))
	a := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithObserver(&ev), quiet)
	b := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithObserver(&ev), quiet)
	client := &http.Client{Transport: slots.NewTransport(base, admitBoth(a, b))}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // alive until the leaks are found
	dropUnread(t, ctx, client, up.URL)
	collectUntil(t, func() bool { return ev.leaked.Load() == 2 })
	assert.Zero(t, a.InFlight())
	assert.Zero(t, b.InFlight())
}

// An ErrorWriter that sets its own Retry-After and retry-after-ms keeps
// both: only the library's own millisecond header goes when the writer's
// Retry-After differs from it. Found by a bug hunt: the writer's
// consistent retry-after-ms was deleted.
func TestErrorWriterKeepsItsOwnRetryHeaders(t *testing.T) {
	ew := func(w http.ResponseWriter, status int, msg string) {
		w.Header().Set("Retry-After", "30")
		w.Header().Set(slots.HeaderRetryAfterMs, "30000")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, msg)
	}
	full := slots.NewLimiter(0)
	h := slots.Middleware(func(*http.Request) (*slots.Slot, error) { return full.TryAcquire() }, slots.WithErrorWriter(ew))(http.NotFoundHandler())
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "30", rec.Header().Get("Retry-After"))
	assert.Equal(t, "30000", rec.Header().Get(slots.HeaderRetryAfterMs))

	only := func(w http.ResponseWriter, status int, msg string) {
		w.Header().Set("Retry-After", "30") // its own, without ms
		w.WriteHeader(status)
	}
	h = slots.Middleware(func(*http.Request) (*slots.Slot, error) { return full.TryAcquire() }, slots.WithErrorWriter(only))(http.NotFoundHandler())
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, "30", rec.Header().Get("Retry-After"))
	assert.Empty(t, rec.Header().Get(slots.HeaderRetryAfterMs), "not the library's, which would disagree")
}

// A Slot that combines a leak-tracked hold with an untracked one (pacing's
// Transport combines its Gate's grant, never tracked, with a fleet's caps)
// is watched on the request's context as before: dropped unread, it is
// freed, all of it, when the context ends. Found by an adversarial review:
// taken as tracked, its untracked part had nothing left to free it.
func TestTransportFreesAMixedCombinedSlotDropped(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "body") }))
	t.Cleanup(up.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	quiet := slots.WithLogger(slog.New(slog.DiscardHandler))
	a := slots.NewLimiter(1, slots.WithLeakDetection(), quiet)
	b := slots.NewLimiter(1, quiet) // untracked
	client := &http.Client{Transport: slots.NewTransport(base, admitBoth(a, b))}
	ctx, cancel := context.WithCancel(context.Background())
	dropUnread(t, ctx, client, up.URL)
	for range 10 {
		runtime.GC()
	}
	cancel()
	waitFor(t, "both parts freed once the context ends", func() bool { return a.InFlight() == 0 && b.InFlight() == 0 })
}

// admitBoth admits a request with a slot of a and one of b, combined.
func admitBoth(a, b *slots.Limiter) slots.AdmitFunc {
	return func(*http.Request) (*slots.Slot, error) {
		sa, err := a.TryAcquire()
		if err != nil {
			return nil, err
		}
		sb, err := b.TryAcquire()
		if err != nil {
			sa.Release()
			return nil, err
		}
		return slots.Combine(sa, sb), nil
	}
}

// dropUnread sends a request under ctx and drops its response unread, in
// a frame of its own, so that nothing here keeps it reachable.
func dropUnread(t *testing.T, ctx context.Context, client *http.Client, url string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_ = resp // dropped unread
}
