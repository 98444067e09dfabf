package pacing_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A learned cap's change is logged under the Gate's lock: a logger that
// panics there left the lock held, and every later call (the grant's
// Release among them) hung, its capacity held for good.
func TestLoggerPanicUnderTheLockLeavesTheGateUsable(t *testing.T) {
	var armed, fired atomic.Bool
	g, err := pacing.NewGate("zai", pacing.Config{MaxConcurrentRequests: 10, Adaptive: &pacing.AdaptiveConfig{Initial: 4}},
		slots.WithLogger(slog.New(testrig.PanicHandler{Match: "learned cap", Armed: &armed, Fired: &fired})))
	require.NoError(t, err)
	var held []pacing.Grant
	for range 3 {
		gt, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		held = append(held, gt)
	}
	armed.Store(true)
	func() {
		defer func() { _ = recover() }() // before the fix the logger's panic came up here
		g.Report(held[2], pacing.Verdict{Kind: pacing.Concurrency})
	}()
	armed.Store(false)
	require.True(t, fired.Load(), "the change was logged")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, gt := range held {
			gt.Slot.Release()
		}
		gt, err := g.Acquire(context.Background(), "m")
		if assert.NoError(t, err) {
			gt.Slot.Release()
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second): // a hang, not a settling wait
		t.Fatal("the Gate's lock was left held by the logger's panic: Release hangs")
	}
	assert.Zero(t, g.Status().InFlight)
}
