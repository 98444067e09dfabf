package pacing_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A budget part that Reconfigure turns on while a request is in flight
// counts that request as started: a refusal by the upstream returns only
// what was charged, and the budget admits no more than its limit.
func TestBudgetPartAddedInFlight(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := pacing.Config{BudgetLimits: pacing.BudgetLimits{OutputTokensPerMinute: 100_000}, MaxQueueWaitMS: 1000}
		g := newGate(t, cfg)
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900, Output: 10})
		require.NoError(t, err)
		cfg.InputTokensPerMinute = 1000
		require.NoError(t, g.Reconfigure(cfg))
		g.Report(a, pacing.Verdict{Kind: pacing.Overload}) // settles a to zero
		a.Slot.Release()
		in := providerBudget(t, g.Status(), pacing.CapInputTokensPerMinute)
		assert.LessOrEqual(t, in.Left, in.Limit, "left %d of a %d budget", in.Left, in.Limit)

		time.Sleep(2 * time.Second) // past Overload's pause
		started := 0
		for range 3 {
			gt, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900})
			if err != nil {
				break
			}
			started += 900
			gt.Slot.Release()
		}
		// The first passes (window empty), the second must not start within the minute.
		assert.LessOrEqual(t, started, 1000, "input tokens started within 3 s under a 1000/min budget")
	})
}

// A Settle that returns input tokens starts a waiter the input budget now
// takes at once, though the request used more tokens in all.
func TestBudgetSettleReturningInputDispatches(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{InputTokensPerMinute: 1000}, MaxQueueWaitMS: 120_000})
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900, Output: 10})
		require.NoError(t, err)
		w := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 500})
		synctest.Wait()
		require.Equal(t, 1, g.Status().Queued)
		start := time.Now()
		g.Settle(a, pacing.Tokens{Input: 100, Output: 900}) // input 900 -> 100: 900 left
		// input back to 100 charged: 900 left, the waiter (500) fits
		r := <-w
		require.NoError(t, r.err)
		assert.Less(t, time.Since(start), time.Second, "started %v after the input came back", time.Since(start))
		r.g.Slot.Release()
		a.Slot.Release()
	})
}

// A refusal reported to a learning Gate returns its tokens to the budget
// and starts waiters only under the cap the refusal has just learned.
func TestBudgetReportRefusalUnderLearnedCap(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 120_000,
			Adaptive: &pacing.AdaptiveConfig{Min: 1, Initial: 4}})
		ctx := context.Background()
		b, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 50})
		require.NoError(t, err)
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900})
		require.NoError(t, err)
		require.Equal(t, 2, a.InFlight)
		w := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 500})
		synctest.Wait()
		require.Equal(t, 1, g.Status().Queued, "waits for the budget")
		g.Report(a, pacing.Verdict{Kind: pacing.Concurrency}) // refused at 2 in flight
		synctest.Wait()
		l := g.Learned()
		st := g.Status()
		t.Logf("learned limit %d cap %d; in flight %d, queued %d", l.Limit, l.Cap, st.InFlight, st.Queued)
		assert.LessOrEqual(t, st.InFlight, max(l.Limit, 2), "a start over the cap the refusal just learned")
		select {
		case r := <-w:
			t.Errorf("the waiter started at once beside 2 holders under a learned limit of %d (err %v)", l.Limit, r.err)
			if r.err == nil {
				r.g.Slot.Release()
			}
		default:
			a.Slot.Release()
			b.Slot.Release()
			if r := <-w; r.err == nil {
				r.g.Slot.Release()
			}
			return
		}
		a.Slot.Release()
		b.Slot.Release()
	})
}

// A JSON answer read to its last byte and closed without the reader
// seeing io.EOF (as json.Decoder on a chunked body does) reports its
// usage.
func TestWatchUsageJSONClosedAfterItsLastByte(t *testing.T) {
	const body = `{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":34}}`
	var got []pacing.Tokens
	rc := pacing.WatchUsage(io.NopCloser(strings.NewReader(body)), "application/json", func(u pacing.Tokens) { got = append(got, u) })
	buf := make([]byte, len(body))
	_, err := io.ReadFull(rc, buf) // every byte, no EOF seen
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	assert.Equal(t, []pacing.Tokens{{Input: 12, Output: 34}}, got)
}

// Refusals by the upstream return their tokens without counting in the
// ratio of use to estimate: the queue is still counted whole, and a
// request that could only time out is refused at once.
func TestBudgetRefusalsKeepTheQueueEstimate(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 70_000})
		ctx := context.Background()
		for range 50 { // upstream refusals (Quota, no key pool: no pause)
			gt, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 10})
			require.NoError(t, err)
			g.Report(gt, pacing.Verdict{Kind: pacing.Quota})
			gt.Slot.Release()
		}
		full, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1000})
		require.NoError(t, err)
		full.Slot.Release()
		w1 := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 500})
		w2 := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 500})
		synctest.Wait()
		require.Equal(t, 2, g.Status().Queued)
		start := time.Now()
		_, err = g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 500}) // needs ~121 s > 70 s
		assert.ErrorIs(t, err, pacing.ErrOverBudget, "refused at once")
		assert.NotErrorIs(t, err, slots.ErrWaitTimeout)
		t.Logf("third: %v after %v", err, time.Since(start))
		for _, c := range []chan result{w1, w2} {
			if r := <-c; r.err == nil {
				r.g.Slot.Release()
			}
		}
	})
}

// A usage too large to add (a hostile or broken upstream's) counts as
// slots.MaxUnits: still a debt, never a refund.
func TestBudgetSettleHugeUsage(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 1000})
		a, err := g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 900})
		require.NoError(t, err)
		g.Settle(a, pacing.Tokens{Input: int(^uint(0) >> 1), Output: int(^uint(0) >> 1)})
		a.Slot.Release()
		left := providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left
		assert.LessOrEqual(t, left, 100, "used more than the estimate, yet left is %d", left)
	})
}

// A stream read a byte at a time, with a line over MaxUsageBody, CRLF
// line ends, and a last chunk with no newline, reports its usage once;
// one closed after message_start only reports nothing.
func TestWatchUsageStreamEdges(t *testing.T) {
	anth := "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n" +
		"data: " + strings.Repeat("x", pacing.MaxUsageBody+5) + "\r\n" +
		"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n"
	var got []pacing.Tokens
	rc := pacing.WatchUsage(io.NopCloser(iotest.OneByteReader(strings.NewReader(anth[:200]+anth[200:]))), "text/event-stream; charset=utf-8", func(u pacing.Tokens) { got = append(got, u) })
	_, err := io.Copy(io.Discard, rc)
	assert.NoError(t, err)
	rc.Close()
	assert.Equal(t, []pacing.Tokens{{Input: 25, Output: 15}}, got)

	// Closed after message_start only: not reported.
	got = nil
	rc = pacing.WatchUsage(io.NopCloser(strings.NewReader(anth[:150])), "text/event-stream", func(u pacing.Tokens) { got = append(got, u) })
	b := make([]byte, 150)
	io.ReadFull(rc, b)
	rc.Close()
	assert.Empty(t, got)

	// OpenAI last chunk with no trailing newline.
	got = nil
	oa := "data: {\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}"
	rc = pacing.WatchUsage(io.NopCloser(iotest.HalfReader(strings.NewReader(oa))), "text/event-stream", func(u pacing.Tokens) { got = append(got, u) })
	io.Copy(io.Discard, rc)
	rc.Close()
	assert.Equal(t, []pacing.Tokens{{Input: 3, Output: 4}}, got)
}

// Under on_wait_timeout "proceed", a request whose wait times out while a
// budget still cannot take it is refused over budget, not let through
// uncharged: here every key's budget. One that the key's budget cannot
// take within the wait is refused at once; two that it can, each alone,
// wait (waiting requests are not counted on a key's budget), and the one
// the refill does not take is refused as its wait ends.
func TestProceedDoesNotPassAKeysBudget(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxQueueWaitMS: 1000, OnWaitTimeout: pacing.Proceed,
			APIKeys: []pacing.KeyConfig{{ID: "k", BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}}}})
		held, err := g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 900})
		require.NoError(t, err)
		held.Slot.Release()
		overBudget := func(err error, what string) {
			t.Helper()
			require.ErrorIs(t, err, pacing.ErrOverBudget, what)
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, "api_key_tokens_per_minute", le.Cap)
			assert.Positive(t, le.RetryAfter)
		}
		_, err = g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 900})
		overBudget(err, "900 + 900 over the key's 1000 for a minute")

		time.Sleep(60*time.Second + 500*time.Millisecond) // the 900 leaves the minute within the wait
		a := acquireTokensAsync(context.Background(), g, "m", pacing.Tokens{Input: 900})
		b := acquireTokensAsync(context.Background(), g, "m", pacing.Tokens{Input: 900})
		synctest.Wait()
		assert.Equal(t, 2, g.Status().Queued, "each fits the refill: both wait")
		ra, rb := <-a, <-b
		if ra.err != nil {
			ra, rb = rb, ra
		}
		require.NoError(t, ra.err, "the refill takes one")
		ra.g.Slot.Release()
		overBudget(rb.err, "the other is still held back as its wait ends")
		assert.Zero(t, g.Status().Bypassed, "none went ahead without a slot")
	})
}

// The same for the provider's budget: requests that the queue estimate
// let wait (it scales the waiting requests by the used-to-estimated ratio
// of the last ones, here 1/100) but that the budget cannot start within
// the wait. With "proceed", those still held back by the budget when the
// wait ends are refused over budget; the tokens started in the minute stay
// within the budget.
func TestProceedDoesNotPassTheProvidersBudget(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		const limit = 1000
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: limit},
			MaxQueueWaitMS: 5000, OnWaitTimeout: pacing.Proceed, MaxQueue: 1000})
		ctx := context.Background()
		for range 40 { // requests that use 1% of their estimates
			gr, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1, Output: 99})
			require.NoError(t, err)
			g.Settle(gr, pacing.Tokens{Input: 1})
			gr.Slot.Release()
		}
		time.Sleep(2 * time.Minute)
		full, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: limit}) // the window full for a minute
		require.NoError(t, err)
		time.Sleep(57 * time.Second)
		var mu sync.Mutex
		var started, overBudget int
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				gr, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 50, Output: 50})
				mu.Lock()
				if err == nil {
					started++
				} else if assert.ErrorIs(t, err, pacing.ErrOverBudget) {
					overBudget++
				}
				mu.Unlock()
				if err != nil {
					return
				}
				time.Sleep(30 * time.Second) // a long answer that uses its whole estimate
				g.Settle(gr, pacing.Tokens{Input: 50, Output: 50})
				gr.Slot.Release()
			})
		}
		wg.Wait()
		full.Slot.Release()
		assert.Equal(t, limit/100, started, "as many as the budget takes once the full minute has passed")
		assert.Equal(t, 50-limit/100, overBudget)
		assert.Zero(t, g.Status().Bypassed, "none went ahead without a slot")
	})
}

// A budget that Reconfigure takes out and puts back within the minute (its
// limits set to 0, or its model or API key taken out of the configuration)
// goes on counting what started under it: after a request of the whole
// budget, the next one waits until that request's second has left the
// minute.
func TestBudgetTakenOutAndPutBackKeepsItsMinute(t *testing.T) {
	budget := pacing.BudgetLimits{TokensPerMinute: 1000}
	const wait = 90_000 // ms: the next request's wait does not end as the budget takes it
	for name, tc := range map[string]struct{ on, off pacing.Config }{
		"provider": {
			on:  pacing.Config{BudgetLimits: budget, MaxQueueWaitMS: wait},
			off: pacing.Config{MaxQueueWaitMS: wait},
		},
		"model": {
			on:  pacing.Config{Models: map[string]pacing.ModelConfig{"m": {BudgetLimits: budget}}, MaxQueueWaitMS: wait},
			off: pacing.Config{MaxQueueWaitMS: wait},
		},
		"key": {
			on:  pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k", BudgetLimits: budget}}, MaxQueueWaitMS: wait},
			off: pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "other"}}, MaxQueueWaitMS: wait},
		},
	} {
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, tc.on)
				first, err := g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 1000})
				require.NoError(t, err)
				first.Slot.Release()
				start := time.Now()
				require.NoError(t, g.Reconfigure(tc.off))
				time.Sleep(time.Second)
				require.NoError(t, g.Reconfigure(tc.on))
				next, err := g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 1000})
				require.NoError(t, err)
				next.Slot.Release()
				assert.GreaterOrEqual(t, time.Since(start), 60*time.Second,
					"1,000 tokens started in the second before, under a budget of 1,000 a minute")
			})
		})
	}
}

// A request that "proceed" lets go ahead without a slot (the provider's cap
// full, its budget with room) starts its tokens all the same: its estimate
// is charged to the budget. Waves of requests that the held cap turns into
// bypasses then start at most the budget in the minute; the rest are
// refused over budget.
func TestProceedChargesTheBypassToItsBudget(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000},
			MaxConcurrentRequests: 1, MaxQueueWaitMS: 1000, OnWaitTimeout: pacing.Proceed, MaxQueue: 1000})
		held, err := g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 1})
		require.NoError(t, err)
		defer held.Slot.Release()
		var mu sync.Mutex
		var bypassed, overBudget int
		for range 10 { // ten waves of 20, in ten seconds
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					gr, err := g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 100})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						assert.ErrorIs(t, err, pacing.ErrOverBudget)
						overBudget++
						return
					}
					assert.True(t, gr.Slot.Bypassed())
					bypassed++
					gr.Slot.Release()
				})
			}
			wg.Wait()
		}
		assert.Equal(t, 9, bypassed, "1 token held, then 9 of 100 under 1,000 a minute")
		assert.Equal(t, 200-9, overBudget)
		assert.Equal(t, 1000-1-9*100, g.Status().Budgets[0].Left, "charged with the bypasses")
	})
}

// A refusal told to come back while a part of its budget had no limit is
// counted, once Reconfigure gives that part a limit, as the request is
// charged to it: at most the whole limit (one empty minute), not its
// tokens in full. A request of a million tokens refused by the requests
// budget made the next refusal, once a budget of 1,000 tokens was added,
// wait for a thousand minutes.
func TestBudgetToldCappedByALimitAdded(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}, MaxQueueWaitMS: 100}
		g := newGate(t, cfg)
		ctx := context.Background()
		big := pacing.Tokens{Input: 1_000_000}
		first, err := g.AcquireTokens(ctx, "m", big)
		require.NoError(t, err)
		first.Slot.Release()
		_, err = g.AcquireTokens(ctx, "m", big)
		require.ErrorIs(t, err, pacing.ErrOverBudget)

		cfg.TokensPerMinute = 1000
		require.NoError(t, g.Reconfigure(cfg))
		_, err = g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 10})
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		t.Logf("told %v", le.RetryAfter)
		assert.LessOrEqual(t, le.RetryAfter, 3*time.Minute, "behind one refused request of the whole budget, then its own minute")
	})
}

// A client that asks again and again without waiting books a return each
// time, but the returns told count at most eight budgets' worth: the next
// client is told to come back within eight minutes and a little more, not
// after every booking (5,000 refusals of a whole budget told it 69 hours),
// also once requests have used four times their estimates (the bound was
// scaled by that ratio: 33 minutes).
func TestBudgetRefusalFloodIsBounded(t *testing.T) {
	for _, used := range []int{1, 4} {
		t.Run(fmt.Sprintf("requests use %dx their estimates", used), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				ctx := context.Background()
				g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 1})
				for range 200 {
					gr, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1})
					require.NoError(t, err)
					g.Settle(gr, pacing.Tokens{Input: used})
					gr.Slot.Release()
				}
				time.Sleep(3 * time.Minute) // the settled requests out of the minute
				gr, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1000})
				require.NoError(t, err)
				gr.Slot.Release()
				var told []time.Duration
				for range 5000 {
					_, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1000})
					var le *slots.LimitError
					require.ErrorAs(t, err, &le)
					told = append(told, le.RetryAfter)
				}
				t.Logf("told %v, %v, %v ... %v", told[0], told[1], told[2], told[len(told)-1])
				assert.IsNonDecreasing(t, told)
				assert.Greater(t, told[1], told[0], "spread")
				assert.LessOrEqual(t, told[len(told)-1], 10*time.Minute)
			})
		})
	}
}
