package slots_test

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// retryAfterOf is how long a client that honours the answer waits: its
// retry-after-ms if there is one (as the OpenAI and Anthropic SDKs read
// it), else its Retry-After in seconds.
func retryAfterOf(h http.Header) time.Duration {
	if v, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && v >= 0 {
		return time.Duration(v * float64(time.Millisecond))
	}
	if v, err := strconv.Atoi(h.Get("Retry-After")); err == nil && v >= 0 {
		return time.Duration(v) * time.Second
	}
	return time.Second
}

// runSaturated serves 12 clients, each sending 4 requests of a 1 s turn
// (give or take 10%, drawn from seed) one after another, through
// Middleware on a Limiter of 2 slots with 4 places in its queue and a
// 500 ms wait; a refused request is sent again after the answer's
// Retry-After, at most 5 times (testrig.Saturate). In virtual time.
func runSaturated(t *testing.T, seed uint64) (out testrig.Saturated) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var rngMu sync.Mutex
	turn := func() time.Duration {
		rngMu.Lock()
		defer rngMu.Unlock()
		return time.Duration((0.9 + 0.2*rng.Float64()) * float64(time.Second))
	}
	testrig.Bubble(t, func(t *testing.T) {
		lim := slots.NewLimiter(2, slots.WithMaxQueue(4), slots.WithMaxWait(500*time.Millisecond))
		h := slots.Middleware(func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { time.Sleep(turn()) }))
		out = testrig.Saturate(12, 4, func(int) (bool, time.Duration) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
			return rec.Code == http.StatusOK, retryAfterOf(rec.Header())
		}, func() bool { return lim.InFlight() < 2 })
	})
	return out
}

// TestRetryAfterSpreadsReturns: clients that honour the Retry-After of a
// saturated server, over ten runs, come back as slots free rather than
// together: almost none gives up, and the capacity does not sit idle while
// they wait. Before the returns were spread and told to the millisecond
// (whole seconds, the same for callers refused together), the same runs
// gave 31-32% of first retries admitted, 54-57 of 480 requests given up,
// a slot free in 7.5-7.8% of the moments clients waited.
//
// Not met here: the goal of 80% of first retries admitted. Each client
// sends its next request the moment its turn ends, so a newcomer is in the
// queue at every slot's release, ahead of a returning caller that was told
// to come at that slot; with a wait of one turn (500 ms for two slots of
// 1 s) nobody who joins behind it is served in time. Appointments (a
// caller that comes when told goes first; others are refused while told
// callers are due) were tried: 75-84% of first retries, but 5-8 requests
// given up and a slot free in 13-50% of the moments (MEASUREMENTS.md).
func TestRetryAfterSpreadsReturns(t *testing.T) {
	var sum testrig.Saturated
	for seed := range uint64(10) {
		r := runSaturated(t, seed)
		assert.Equal(t, 48, r.Requests)
		sum.Add(r)
	}
	first, free := sum.FirstRetries(), sum.Free()
	t.Logf("%d requests: %d refused at first, %d of them admitted at their first retry (%.0f%%); %d gave up; a slot free in %.1f%% of %d moments clients waited",
		sum.Requests, sum.FirstRefused, sum.FirstRetryAdmitted, 100*first, sum.GaveUp, 100*free, sum.WaitingMoments)
	assert.GreaterOrEqual(t, first, 0.55, "first retries admitted")
	assert.LessOrEqual(t, sum.GaveUp, sum.Requests/100, "requests given up")
	assert.LessOrEqual(t, free, 0.2, "moments a slot sat free while clients waited")
}

// Callers refused together while every holder is past the mean hold are
// told to come back one after another as the slots free, not all at the
// same instant: an overdue holder frees any moment, so the first four are
// told soon, and the next four a mean hold later, and so on. (They were
// all told 1 ms: the return booked for now was taken as come back by the
// very next refusal.)
func TestRetryAfterSpreadsPastOverdueHolders(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		lim := slots.NewLimiter(4)
		testrig.WarmHolds(t, 100*time.Millisecond, lim.TryAcquire)
		for range 4 {
			s, err := lim.TryAcquire()
			require.NoError(t, err)
			defer s.Release()
		}
		time.Sleep(time.Second) // every holder ten times past the mean
		var told []time.Duration
		for range 20 {
			_, err := lim.TryAcquire()
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			told = append(told, le.RetryAfter)
		}
		t.Logf("told: %v", told)
		assert.IsNonDecreasing(t, told)
		assert.Less(t, told[3], 100*time.Millisecond, "the first four within a mean hold")
		assert.GreaterOrEqual(t, told[19], 400*time.Millisecond, "the twentieth after four more rounds of the four slots")
	})
}

// A weighted caller is told when the units it needs free, not a turn of
// one unit: a holder's end frees all it holds.
func TestRetryAfterCountsUnits(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		lim := slots.NewLimiter(100)
		testrig.WarmHolds(t, time.Second, lim.TryAcquire)
		big, err := lim.TryAcquireN(60)
		require.NoError(t, err)
		defer big.Release()
		_, err = lim.TryAcquireN(50)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, time.Second, le.RetryAfter, "50 units beside a holder of 60: when it ends, not a hundredth of a hold")

		all, err := lim.TryAcquireN(40)
		require.NoError(t, err)
		defer all.Release()
		time.Sleep(200 * time.Millisecond)
		var told []time.Duration
		for range 100 {
			_, err := lim.TryAcquire()
			require.ErrorAs(t, err, &le)
			told = append(told, le.RetryAfter)
		}
		t.Logf("told: %v ... %v", told[:3], told[97:])
		// The caller of 50 told to come back at 1 s goes first.
		assert.Equal(t, 800*time.Millisecond, told[49], "the 50th one-unit caller: when the holders of 60 and 40 end")
		assert.Equal(t, 1800*time.Millisecond, told[50], "the 51st: a mean hold later")
		assert.Equal(t, 1800*time.Millisecond, told[99])
	})
}

// Callers refused beside free units that are not theirs (reserved for
// another class) are told turns of the whole lane, one after another, not
// all the same short answer as if the free units were theirs.
func TestRetryAfterBesideAReserve(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		lim := slots.NewLimiter(10, slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 5}))
		testrig.WarmHolds(t, time.Second, lim.TryAcquire)
		for range 5 {
			s, err := lim.TryAcquire()
			require.NoError(t, err)
			defer s.Release()
		}
		var told []time.Duration
		for range 8 {
			_, err := lim.TryAcquire()
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			told = append(told, le.RetryAfter)
		}
		t.Logf("told: %v", told)
		assert.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond,
			500 * time.Millisecond, 600 * time.Millisecond, 700 * time.Millisecond, 800 * time.Millisecond}, told,
			"a tenth of a mean hold apart, the turns of ten slots")
	})
}

// The hold-time estimate samples releases spread over their sequence, so a
// workload that alternates short and long holds is estimated from both: a
// fixed one in sixteen saw only one of them (every sampled ID even), and
// told 10 ms where half the holds last 10 s.
func TestHoldEstimateOfAlternatingHolds(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		lim := slots.NewLimiter(1)
		for i := range 400 {
			s, err := lim.TryAcquire()
			require.NoError(t, err)
			time.Sleep([]time.Duration{10 * time.Millisecond, 10 * time.Second}[i%2])
			s.Release()
		}
		s, err := lim.TryAcquire()
		require.NoError(t, err)
		defer s.Release()
		_, err = lim.TryAcquire()
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		t.Logf("told %v: holds of 10 ms and 10 s in turn", le.RetryAfter)
		assert.Greater(t, le.RetryAfter, time.Second)
		assert.Less(t, le.RetryAfter, 9*time.Second)
	})
}
