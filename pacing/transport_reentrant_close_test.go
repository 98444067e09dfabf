package pacing_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// readsToEnd reports whether a read of body to its end, on a goroutine of
// the bubble, returns within a minute of the bubble's time.
func readsToEnd(body io.ReadCloser) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(io.Discard, body)
	}()
	select {
	case <-done:
		return true
	case <-time.After(time.Minute):
		return false
	}
}

// A report that closes the body it reports on, on the goroutine whose
// Read is making it (a Trace's Settled hook, ClassifyAsRead's report,
// WatchUsage's f), does not hang that Read: the Close, which waits for a
// report under way so that the slot goes after it, waits at most 5 s, and
// the slot is freed. Found by review: the Close waited for the report it
// was called from, for good.
func TestReentrantCloseDoesNotHangTheRead(t *testing.T) {
	for _, tc := range []struct {
		name         string
		status       int
		answer, body string
	}{
		{"usage settled", 200, usageAnswer, `{"model":"m"}`},
		{"refusal reported", 429, `{"error":{"type":"rate_limit_error","message":"slow down"}}`, `{"model":"m"}`},
	} {
		t.Run("a Settled hook: "+tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base, _ := answering(tc.status, tc.answer)
				gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
				_, rt := tenantBudgets(gate, base, pacing.WithCutLinger(0))
				var resp *http.Response
				ctx := pacing.WithTrace(tenantCtx(context.Background(), "a", pacing.Tokens{Input: 300, Output: 500}), &pacing.Trace{
					Settled: func(pacing.Settlement) { resp.Body.Close() },
				})
				var err error
				resp, err = rt.RoundTrip(post(t, ctx, tc.body))
				require.NoError(t, err)
				start := time.Now()
				require.True(t, readsToEnd(resp.Body), "the read that reported never returned")
				assert.LessOrEqual(t, time.Since(start), 5*time.Second)
				assert.Zero(t, gate.Status().InFlight, "the slot is freed")
			})
		})
	}
	t.Run("ClassifyAsRead's report", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			resp := &http.Response{StatusCode: 429, Header: http.Header{},
				Body: io.NopCloser(strings.NewReader(`{"error":{"type":"rate_limit_error"}}`))}
			reported := 0
			pacing.ClassifyAsRead(resp, nil, func(pacing.Verdict) { reported++; resp.Body.Close() })
			require.True(t, readsToEnd(resp.Body), "the read that reported the verdict never returned")
			assert.Equal(t, 1, reported)
		})
	})
	t.Run("WatchUsage's f", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var body io.ReadCloser
			var used pacing.Tokens
			body = pacing.WatchUsage(io.NopCloser(strings.NewReader(usageAnswer)), "application/json",
				func(u pacing.Tokens) { used = u; body.Close() })
			require.True(t, readsToEnd(body), "the read that settled the usage never returned")
			assert.Equal(t, pacing.Tokens{Input: 3, Output: 5}, used)
		})
	})
}
