package pacing_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// An answer's body closed while the usage it reported is being settled on
// the goroutine that read its end frees the slot only once the usage is
// settled: the tenant's reservation is settled with what the request used
// (not closed first with its estimate standing), and the Trace hears
// Settled before Released.
func TestTransportCloseDuringTheUsageWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, _ := answering(200, usageAnswer) // 3 + 5 tokens used
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
		tenants, rt := tenantBudgets(gate, base, pacing.WithCutLinger(0))
		entered, release := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		var heard []string
		hear := func(s string) { mu.Lock(); heard = append(heard, s); mu.Unlock() }
		ctx := pacing.WithTrace(tenantCtx(t.Context(), "a", pacing.Tokens{Input: 300, Output: 500}), &pacing.Trace{
			Settled: func(pacing.Settlement) {
				close(entered)
				<-release // a Trace that takes its time
				hear("settled")
			},
			Released: func(pacing.Admission, time.Duration) { hear("released") },
		})
		resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
		require.NoError(t, err)

		assert.False(t, closesBeforeTheReport(resp, entered, release), "Close returned before the usage was settled")

		assert.Zero(t, gate.Status().InFlight)
		assert.Equal(t, 1000-8, tenants.Status("a")[0].Left, "settled with the 8 tokens used")
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []string{"settled", "released"}, heard)
	})
}
