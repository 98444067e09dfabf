package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// runFleetSaturated is the saturated scenario of slots'
// TestRetryAfterSpreadsReturns on a fleet key: 12 clients, 6 on each of two
// processes, each sending 4 requests of a 1 s turn (give or take 10%, from
// seed) one after another, on a key of 2 slots, with a queue of 4 and a
// 500 ms wait in each process; a refused request is sent again after its
// RetryAfter, at most 5 times (testrig.Saturate). On a virtual Redis, in
// virtual time.
func runFleetSaturated(t *testing.T, seed uint64) (out testrig.Saturated) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		rs := fwFleet(t, srv, "saturated", 2, 2, WithLogger(quiet()),
			WithLocalOptions(slots.WithMaxQueue(4), slots.WithMaxWait(500*time.Millisecond)))
		// Each client draws from its own generator: no draw depends on the
		// order goroutines run in.
		var rngs [12]*rand.Rand
		for c := range rngs {
			rngs[c] = rand.New(rand.NewPCG(seed, uint64(c)))
		}
		out = testrig.Saturate(12, 4, func(c int) (bool, time.Duration) {
			s, err := rs[c%2].Acquire(context.Background(), "k")
			if err == nil {
				time.Sleep(time.Duration((0.9 + 0.2*rngs[c].Float64()) * float64(time.Second)))
				s.Release()
				return true, 0
			}
			var le *slots.LimitError
			if !errors.As(err, &le) {
				t.Errorf("not a refusal: %v", err)
				return true, 0 // the client stops: this request is not one to retry
			}
			return false, le.RetryAfter
		}, func() bool { return rs[0].Local().InFlight("k")+rs[1].Local().InFlight("k") < 2 })
	})
	return out
}

// TestFleetRetryAfterFollowsTheKey: clients that honour a saturated fleet
// key's Retry-After, over ten runs, come back as its slots free. The runs
// are not quite the same each time (the order in which goroutines reach the
// store varies), so the test asserts loose bounds and logs its figures;
// TestFullKeyRetryAfterFollowsItsHolds, the tests below it and
// TestFleetRetryAfterCountsTheOtherProcessesReturns are the ones that
// tell the rules apart. Seen here, seven runs of the test: 50-59% of
// first retries admitted, 0-3 of 480 requests given up, a slot free in
// 5.3-7.3% of the moments clients waited. Before each process counted the
// returns the other tells, and spread the callers refused before a hold
// of the key had ended, eighteen runs: 38-45%, 4-13 and 2.0-5.3%. The
// issue's goal of 80%, met on one process's caps, is not met here: the
// returns told are each process's, so two processes tell theirs on the
// same frees out of step (with the returns told kept in one place for
// both, in a trial, 61-63%, a slot free in 18-21% of the moments).
func TestFleetRetryAfterFollowsTheKey(t *testing.T) {
	if testing.Short() {
		t.Skip("ten virtual runs of some 20 s")
	}
	var sum testrig.Saturated
	for seed := range uint64(10) {
		r := runFleetSaturated(t, seed)
		assert.Equal(t, 48, r.Requests)
		sum.Add(r)
	}
	first, free := sum.FirstRetries(), sum.Free()
	var told time.Duration
	for _, d := range sum.Told {
		told += d
	}
	t.Logf("%d requests: %d refused at first, %d of them admitted at their first retry (%.0f%%); %d gave up; a slot free in %.1f%% of %d moments clients waited; mean Retry-After %v of %d",
		sum.Requests, sum.FirstRefused, sum.FirstRetryAdmitted, 100*first, sum.GaveUp, 100*free, sum.WaitingMoments,
		(told / time.Duration(max(len(sum.Told), 1))).Round(time.Millisecond), len(sum.Told))
	assert.GreaterOrEqual(t, first, 0.45, "first retries admitted")
	assert.LessOrEqual(t, sum.GaveUp, 10, "requests given up")
	assert.LessOrEqual(t, free, 0.2, "moments a slot sat free while clients waited")
}

// A key at its limit tells a refused caller when its slot should free from
// the key's own holds, spread behind the callers told before: not when its
// earliest lease would expire, which a live holder keeps renewing (the
// lease TTL, 30 s here, whatever the holds), and not from another key's
// holds. A key none of whose holds has ended here still says the expiry.
// On a virtual Redis, in virtual time.
func TestFullKeyRetryAfterFollowsItsHolds(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		r := fwFleet(t, srv, "full-key", 1, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet()))[0]
		warm := func(key string, hold time.Duration) {
			for range 3 {
				s, err := r.Acquire(context.Background(), key) // a release reaches the store a moment later
				if !assert.NoError(t, err) {
					return
				}
				time.Sleep(hold)
				s.Release()
			}
		}
		warm("fast", 50*time.Millisecond)
		warm("slow", 4*time.Second)
		refused := func(key string) time.Duration {
			_, err := r.TryAcquire(key)
			var le *slots.LimitError
			if !assert.ErrorAs(t, err, &le, key) {
				return 0
			}
			assert.ErrorIs(t, err, slots.ErrLimitReached)
			return le.RetryAfter
		}
		for _, key := range []string{"fast", "slow", "cold"} {
			s, err := r.Acquire(context.Background(), key)
			if !assert.NoError(t, err) {
				return
			}
			defer s.Release()
		}
		time.Sleep(10 * time.Millisecond) // the holds have begun
		fast, slow, slowAgain, cold := refused("fast"), refused("slow"), refused("slow"), refused("cold")
		t.Logf("told: fast key %v, slow key %v then %v, cold key %v", fast, slow, slowAgain, cold)
		assert.LessOrEqual(t, fast, 100*time.Millisecond, "the fast key's holds")
		assert.GreaterOrEqual(t, slow, 2*time.Second, "the slow key's holds, not the fast key's")
		assert.Less(t, slow, 10*time.Second, "nor the lease's expiry")
		assert.Greater(t, slowAgain, slow, "a caller refused after another is told to come after it")
		assert.GreaterOrEqual(t, cold, 10*time.Second, "a key with no hold ended: the expiry")
	})
}

// A caller that timed out in the fleet's queue is told when the slot it
// waited for should free, a little early (it may queue again), not a turn
// later: the store's count of the queue was its own place too. A refusal
// of several keys names the full one, and takes its holds. On a virtual
// Redis, in virtual time.
func TestFleetRetryAfterOfATimeoutAndOfSeveralKeys(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		r := fwFleet(t, srv, "timeout", 1, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet()),
			WithLocalOptions(slots.WithMaxWait(100*time.Millisecond)))[0]
		hold := func(key string, d time.Duration) {
			s, err := r.Acquire(context.Background(), key)
			if assert.NoError(t, err) {
				time.Sleep(d)
				s.Release()
			}
		}
		hold("slow", 2*time.Second)
		hold("fast", 20*time.Millisecond)
		s, err := r.Acquire(context.Background(), "slow")
		require.NoError(t, err)
		defer s.Release()
		start := time.Now()
		_, err = r.Acquire(context.Background(), "slow")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		frees := 2*time.Second - time.Since(start)
		t.Logf("timed out after %v; told %v, the slot frees in about %v", time.Since(start), le.RetryAfter, frees)
		assert.LessOrEqual(t, le.RetryAfter, 2*time.Second, "not a turn late")
		assert.GreaterOrEqual(t, le.RetryAfter, frees-100*time.Millisecond, "nor much before the slot frees")

		_, err = r.TryAcquireAll("fast", "slow")
		require.ErrorAs(t, err, &le)
		assert.Contains(t, le.Key, "slow", "the full key is named")
		assert.GreaterOrEqual(t, le.RetryAfter, time.Second, "and its holds tell the time, not the fast key's")
	})
}

// The estimates are bounded in keys: past the bound, a key whose holds
// ended long ago goes, and a key in use stays.
func TestKeyHoldsKeepTheKeysInUse(t *testing.T) {
	var h keyHolds
	h.observe([]string{"hot"}, int64(time.Second))
	for i := range 3 * maxKeyHolds {
		h.observe([]string{fmt.Sprint("once-", i)}, int64(time.Millisecond))
		if i%100 == 0 {
			h.observe([]string{"hot"}, int64(time.Second))
		}
	}
	assert.LessOrEqual(t, len(h.m), maxKeyHolds)
	_, ok := h.retryAfter("hot", 0, 1, 1, 1, 1, 0, 0, nil)
	assert.True(t, ok, "the key in use keeps its estimate")
}

// A store's count of queued callers out of range (a bad reply) gives a
// long Retry-After, not a short one: a count that would wrap is as many
// as can be said, and a negative one is none.
func TestRetryAfterOfAQueueOutOfRange(t *testing.T) {
	var h core.HoldTime
	h.Observe(int64(time.Second))
	assert.Equal(t, 9*time.Second, h.RetryAfter(0, 1, needOf(math.MaxInt, 1), 1, nil, 0, nil), "a queue of MaxInt does not wrap: eight rounds of the slot, at most, and a turn")
	assert.Equal(t, time.Second, h.RetryAfter(0, 1, needOf(-5, 1), 1, nil, 0, nil), "a negative queue counts as none")
	told := new(core.Told)
	h.RetryAfter(0, 1, needOf(0, 1), 1, nil, 0, told)
	assert.Equal(t, 2*time.Second, h.RetryAfter(0, 1, needOf(-5, 1), 1, nil, 0, told), "and cancels no return told")
}

// A weighted caller refused on a full key is told when the units it needs
// should free, not a turn of one unit: 50 units of a key of 100 take half
// the key's turn of a mean hold, one unit a hundredth. On a virtual Redis,
// in virtual time.
func TestFullKeyRetryAfterCountsUnits(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		r := fwFleet(t, srv, "units", 1, 100, WithLeaseTTL(30*time.Second), WithLogger(quiet()))[0]
		for range 3 { // a mean hold of 2 s
			s, err := r.Acquire(context.Background(), "k")
			require.NoError(t, err)
			time.Sleep(2 * time.Second)
			s.Release()
		}
		s, err := r.AcquireN(context.Background(), "k", 100)
		require.NoError(t, err)
		defer s.Release()
		time.Sleep(10 * time.Millisecond)
		refused := func(n int) time.Duration {
			_, err := r.TryAcquireN("k", n)
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			require.ErrorIs(t, err, slots.ErrLimitReached)
			return le.RetryAfter
		}
		one, fifty := refused(1), refused(50)
		t.Logf("told: one unit %v, fifty units %v", one, fifty)
		assert.Less(t, one, 100*time.Millisecond, "a hundredth of a mean hold")
		assert.GreaterOrEqual(t, fifty, time.Second, "fifty hundredths of it, behind the one told before")
	})
}

// Callers refused together before any hold of the key has ended here are
// spread as later ones are, from this Registry's holds (or a second's
// hold, before any): not all told the same time. On a virtual Redis, in
// virtual time.
func TestFleetRetryAfterSpreadsCallersRefusedAtTheStart(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		r := fwFleet(t, srv, "cold", 1, 1, WithLogger(quiet()), WithLocalOptions(slots.WithMaxQueue(0)))[0]
		s, err := r.Acquire(context.Background(), "k")
		require.NoError(t, err)
		defer s.Release()
		var told []time.Duration
		for range 3 {
			_, err := r.Acquire(context.Background(), "k")
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			require.ErrorIs(t, err, slots.ErrQueueFull)
			told = append(told, le.RetryAfter)
		}
		t.Logf("told %v", told)
		for i := 1; i < len(told); i++ {
			assert.GreaterOrEqual(t, told[i]-told[i-1], 900*time.Millisecond, "a turn of the slot after the one told before")
		}
	})
}

// A process that holds part of a fleet key spreads its refused callers
// over its part of the key's frees: the other processes tell their own
// callers of the same frees, as many per unit held as this one is taken
// to. Holding one of two slots, each refusal here is told a turn of the
// key (a mean hold over the limit) for itself and one for the callers the
// other process tells; holding both, a turn for itself. On a virtual
// Redis, in virtual time.
func TestFleetRetryAfterCountsTheOtherProcessesReturns(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		rs := fwFleet(t, srv, "shared", 2, 2, WithLogger(quiet()), WithLocalOptions(slots.WithMaxQueue(0)))
		hold := func(r *Registry[string], key string) func() {
			s, err := r.Acquire(context.Background(), key)
			require.NoError(t, err)
			return func() { s.Release() }
		}
		for _, key := range []string{"shared", "mine"} { // a mean hold of 1 s here
			for range 3 {
				release := hold(rs[0], key)
				time.Sleep(time.Second)
				release()
			}
		}
		spacing := func(key string) time.Duration {
			var told []time.Duration
			for range 3 {
				_, err := rs[0].Acquire(context.Background(), key)
				var le *slots.LimitError
				require.ErrorAs(t, err, &le)
				require.ErrorIs(t, err, slots.ErrQueueFull)
				told = append(told, le.RetryAfter)
			}
			t.Logf("%s: told %v", key, told)
			return (told[2] - told[0]) / 2
		}
		defer hold(rs[0], "shared")()
		defer hold(rs[1], "shared")()
		defer hold(rs[0], "mine")()
		defer hold(rs[0], "mine")()
		time.Sleep(10 * time.Millisecond) // the releases above have reached the store
		shared, mine := spacing("shared"), spacing("mine")
		assert.InDelta(t, float64(time.Second), float64(shared), float64(100*time.Millisecond), "holding half the key: a turn for each process")
		assert.InDelta(t, float64(500*time.Millisecond), float64(mine), float64(50*time.Millisecond), "holding all of it: a turn of the key")
	})
}

// Refusals on keys none of whose holds has ended here (full in other
// processes) make entries of their own, which go before a key whose holds
// are known: a flood of them on many keys leaves that key its estimate,
// and a key refused all along its returns told.
func TestKeyHoldsKeepKnownKeysPastRefusals(t *testing.T) {
	var h keyHolds
	var cold core.HoldTime
	h.observe([]string{"hot"}, int64(time.Second))
	dropped := 0
	for i := range 20 * maxKeyHolds {
		_, ok := h.retryAfter(fmt.Sprint("refused-", i), 0, 1, 1, 0, 1, 0, 0, &cold)
		require.True(t, ok)
		if h.m["steady"] == nil && i > 0 {
			dropped++
		}
		_, ok = h.retryAfter("steady", 0, 1, 1, 0, 1, 0, 0, &cold) // refused all along
		require.True(t, ok)
	}
	assert.LessOrEqual(t, len(h.m), maxKeyHolds)
	assert.Zero(t, dropped, "a key refused all along keeps its returns told")
	_, ok := h.retryAfter("hot", 0, 1, 1, 1, 1, 0, 0, nil)
	assert.True(t, ok, "the key whose holds are known keeps its estimate")
}

// A process that holds little of a key counts the returns told elsewhere
// as if the key were shared by four processes at most: its refused
// callers are still spread, not told the bound's time one after another.
func TestRetryAfterOfAProcessHoldingLittleOfAKey(t *testing.T) {
	var h keyHolds
	h.observe([]string{"k"}, int64(time.Second))
	var last time.Duration
	for i := range 20 {
		d, ok := h.retryAfter("k", 0, 1, 100, 1, 100, 0, 0, nil)
		require.True(t, ok)
		if i > 0 {
			assert.Greater(t, d, last, "refusal %d told after the one before", i)
		}
		last = d
	}
	t.Logf("the 20th told %v", last)
}

// A return told from a time before which nothing frees (a pause's end) is
// rounded up to the millisecond, as the estimate is, and says no more than
// core.MaxRetryAfter past a pause shorter than it.
func TestRetryAfterFromAPause(t *testing.T) {
	var h keyHolds
	h.observe([]string{"k"}, int64(time.Second))
	from := 10*time.Second + 500*time.Microsecond + 1
	d, ok := h.retryAfter("k", 0, 1, 2, 1, 2, 0, from, nil)
	require.True(t, ok)
	assert.Zero(t, d%time.Millisecond, "to the millisecond: %v", d)
	assert.Greater(t, d, from, "not before the pause ends")

	var slow keyHolds
	slow.observe([]string{"k"}, int64(time.Hour))
	for range 20 { // told up to eight rounds of an hour's holds
		d, ok = slow.retryAfter("k", 0, 1, 1, 1, 1, 0, time.Minute, nil)
		require.True(t, ok)
		assert.LessOrEqual(t, d, core.MaxRetryAfter)
	}
	d, ok = slow.retryAfter("k", 0, 1, 1, 1, 1, 0, 2*time.Hour, nil)
	require.True(t, ok)
	assert.Greater(t, d, 2*time.Hour, "not before a pause longer than the cap ends")
}
