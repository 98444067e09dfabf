package pacing_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A Reconfigure whose OnLimitChange hook panics still wakes the waiters it
// refused (a token cap lowered below them): the panic reaches the caller,
// and the refused request returns its refusal rather than waiting forever.
func TestReconfigureHookPanicWakesRefused(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := func(tokens, ceiling int) pacing.Config {
			return pacing.Config{MaxInflightTokens: tokens, Adaptive: &pacing.AdaptiveConfig{Max: ceiling}}
		}
		g := newGate(t, cfg(10, 16))
		defer g.Close()
		held, err := g.AcquireN(context.Background(), "m", 5)
		require.NoError(t, err)
		defer held.Slot.Release()
		type res struct{ err error }
		waiter := make(chan res, 1)
		go func() {
			gt, err := g.AcquireN(context.Background(), "m", 8)
			if err == nil {
				gt.Slot.Release()
			}
			waiter <- res{err}
		}()
		synctest.Wait()
		require.Len(t, waiter, 0, "8 tokens wait: 5 of 10 are held")
		g.OnLimitChange(func(pacing.LimitChange) { panic("the hook failed") })
		assert.Panics(t, func() { _ = g.Reconfigure(cfg(6, 8)) }, "the ceiling changed: the hook is called, and its panic reaches the caller")
		synctest.Wait()
		require.Len(t, waiter, 1, "the waiter refused by the lowered token cap is woken")
		var le *slots.LimitError
		err = (<-waiter).err
		require.True(t, errors.As(err, &le), "%v", err)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
		assert.Equal(t, pacing.CapTokens, le.Cap)
	})
}
