package slots_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

func TestLimiterNeverAdmitsAnEndedContext(t *testing.T) {
	t.Run("ended before Acquire", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := lim.Acquire(ctx)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Zero(t, lim.InFlight())
	})
	t.Run("ends after the first look and before the decision", func(t *testing.T) {
		lim := slots.NewLimiter(1, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
		s, err := lim.Acquire(testrig.EndsOnLookup())
		assert.ErrorIs(t, err, context.Canceled, "a free slot is not given to a caller that has given up")
		assert.Nil(t, s)
		assert.Zero(t, lim.InFlight())
		assert.Equal(t, uint64(0), lim.Stats().Acquired)
	})
}
