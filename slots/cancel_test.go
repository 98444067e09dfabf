package slots_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/slots"
)

// endsOnLookup is a context that ends the first time a value is looked up
// in it. With shares, an admission reads the caller's class from its context
// before it decides, so the context ends after any check made earlier and
// before the decision: the window of golang/go#63615.
type endsOnLookup struct {
	context.Context
	cancel context.CancelFunc
}

func (c endsOnLookup) Value(key any) any {
	c.cancel()
	return c.Context.Value(key)
}

func newEndsOnLookup() endsOnLookup {
	ctx, cancel := context.WithCancel(context.Background())
	return endsOnLookup{ctx, cancel}
}

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
		s, err := lim.Acquire(newEndsOnLookup())
		assert.ErrorIs(t, err, context.Canceled, "a free slot is not given to a caller that has given up")
		assert.Nil(t, s)
		assert.Zero(t, lim.InFlight())
		assert.Equal(t, uint64(0), lim.Stats().Acquired)
	})
}
