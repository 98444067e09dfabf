package pacing_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A reservation made before its request waited (for a slot, say) is moved
// by Start to the second the request starts in, as the budget counts a
// request: one reserved at 0 and started at 30 s still counts at 61 s, so
// a request reserved then that would pass the budget with it is refused.
// Without the move, 1,100 tokens started within a minute against 1,000.
func TestBudgetStartMovesTheCharge(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10})
		require.NoError(t, err)
		early, err := b.Reserve(pacing.Tokens{Input: 600})
		require.NoError(t, err)
		time.Sleep(30 * time.Second) // it waits for its slot
		require.NoError(t, early.Start())
		require.NoError(t, early.Start(), "a second Start is a no-op")
		time.Sleep(31 * time.Second) // 61 s after the reservation, 31 s after the start
		_, err = b.Reserve(pacing.Tokens{Input: 500})
		require.ErrorIs(t, err, pacing.ErrOverBudget, "the 600 started 31 s ago")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 600, le.InFlight)
		assert.InDelta(t, 30*time.Second, le.RetryAfter, float64(time.Second))
		st := b.Status()
		require.Len(t, st, 2)
		assert.Equal(t, 9, st[1].Left, "the request counted once, in its second")

		early.Settle(pacing.Tokens{Input: 100}) // settles in the second it moved to
		r, err := b.Reserve(pacing.Tokens{Input: 500})
		require.NoError(t, err, "the overestimate came back where it was charged")
		r.Cancel()
		assert.Equal(t, 900, b.Status()[0].Left)
	})
}

// A reservation whose charge left the minute while its request waited is
// charged again at Start only if it fits: the budget spent by others since
// refuses it, with when it will fit, and it charges nothing (Cancel and
// Settle after it do nothing). One that fits is charged in its start's
// second.
func TestBudgetStartPastTheMinute(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10})
		require.NoError(t, err)
		late, err := b.Reserve(pacing.Tokens{Input: 600})
		require.NoError(t, err)
		time.Sleep(61 * time.Second) // its charge has left the minute
		other, err := b.Reserve(pacing.Tokens{Input: 600})
		require.NoError(t, err, "an empty minute")
		require.NoError(t, other.Start())
		err = late.Start()
		require.ErrorIs(t, err, pacing.ErrOverBudget, "600 more over the 600 started in this minute")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapTokensPerMinute, le.Cap)
		assert.Equal(t, 600, le.InFlight)
		assert.Equal(t, 1000, le.Limit)
		assert.Greater(t, le.RetryAfter, 59*time.Second)
		again := late.Start()
		require.ErrorIs(t, again, pacing.ErrOverBudget, "refused once, refused again")
		assert.NotSame(t, le, again, "a copy each time: a caller may name it as its own")
		late.Settle(pacing.Tokens{Input: 900}) // a misuse: it was not sent
		late.Cancel()
		st := b.Status()
		assert.Equal(t, 400, st[0].Left, "the refused request charges nothing")
		assert.Equal(t, 9, st[1].Left)

		time.Sleep(61 * time.Second)
		fits, err := b.Reserve(pacing.Tokens{Input: 300})
		require.NoError(t, err)
		time.Sleep(61 * time.Second)
		require.NoError(t, fits.Start(), "300 fits the empty minute")
		st = b.Status()
		assert.Equal(t, 700, st[0].Left, "charged again in the second it starts")
		assert.Equal(t, 9, st[1].Left)
		fits.Settle(pacing.Tokens{Input: 200})
		assert.Equal(t, 800, b.Status()[0].Left)

		// A budget's first request passes at its start too, however large.
		time.Sleep(61 * time.Second)
		big, err := b.Reserve(pacing.Tokens{Input: 5000})
		require.NoError(t, err)
		time.Sleep(61 * time.Second)
		require.NoError(t, big.Start())
		assert.Equal(t, -4000, b.Status()[0].Left)
		var none *pacing.Reservation
		assert.NoError(t, none.Start(), "a nil Reservation starts nothing")
	})
}

// Reservations started, settled and cancelled from many goroutines while
// the clock moves, counted apart from the Budget: what the Budget counts
// in the minute is what the started ones settled with, and a Start racing
// a Settle of the same reservation never counts it twice.
func TestBudgetStartHammer(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1_000_000, MaxRequestsPerMinute: 100_000})
		require.NoError(t, err)
		var mu sync.Mutex
		want := 0
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				r, err := b.Reserve(pacing.Tokens{Input: 100})
				if !assert.NoError(t, err) {
					return
				}
				time.Sleep(time.Duration(i%7) * time.Second)
				var inner sync.WaitGroup
				inner.Go(func() { _ = r.Start() })
				if i%3 == 0 {
					r.Cancel()
					inner.Wait()
					return
				}
				r.Settle(pacing.Tokens{Input: i})
				inner.Wait()
				mu.Lock()
				want += i
				mu.Unlock()
			})
		}
		wg.Wait()
		st := b.Status()
		assert.Equal(t, 1_000_000-want, st[0].Left)
	})
}
