package pacing_test

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A refusal's body closed while its verdict is being taken on the
// goroutine that read its end (the request's context ended as a
// ReverseProxy read it, say) frees the slot only once the verdict is
// reported: the Gate hears the answer before the slot goes, the tenant's
// reservation is cancelled (a request the upstream refused charges
// nothing), and the Trace hears Settled before Released.
func TestTransportCloseDuringTheVerdictWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, sent := answering(429, `{"error":{"type":"rate_limit_error","message":"slow down"}}`)
		entered, release := make(chan struct{}), make(chan struct{})
		classify := func(status int, h http.Header, body []byte) pacing.Verdict {
			close(entered)
			<-release // a Classifier that takes its time
			return pacing.DefaultClassifier(status, h, body)
		}
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
		tenants, rt := tenantBudgets(gate, base, pacing.WithClassifier(classify), pacing.WithCutLinger(0))
		var mu sync.Mutex
		var heard []string
		hear := func(s string) { mu.Lock(); heard = append(heard, s); mu.Unlock() }
		ctx := pacing.WithTrace(tenantCtx(t.Context(), "a", pacing.Tokens{Input: 600}), &pacing.Trace{
			Settled:  func(st pacing.Settlement) { hear("settled") },
			Released: func(pacing.Admission, time.Duration) { hear("released") },
		})
		resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
		require.NoError(t, err)
		require.Equal(t, 1, sent())

		assert.False(t, closesBeforeTheReport(resp, entered, release), "Close returned before the verdict was reported")

		assert.Zero(t, gate.Status().InFlight)
		assert.Equal(t, 1000, tenants.Status("a")[0].Left, "the upstream refused it: it charges the tenant nothing")
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []string{"settled", "released"}, heard)
	})
}

// closesBeforeTheReport reads resp's body to its end on a goroutine of the
// bubble (its Read makes a report, which closes entered and waits for
// release), closes the body on another once the report is under way, and
// reports whether that Close returned before the report was let go on. It
// returns once both have.
func closesBeforeTheReport(resp *http.Response, entered, release chan struct{}) bool {
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	<-entered
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		resp.Body.Close()
	}()
	synctest.Wait()
	early := false
	select {
	case <-closed:
		early = true
	default:
	}
	close(release)
	<-read
	<-closed
	return early
}
