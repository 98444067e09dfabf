package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// learnFleet opens n Registries named name on srv, each learning key "p"
// under a.
func learnFleet(t *testing.T, srv redisServer, name string, n int, a upstream.AdaptiveConfig) []*Registry[string] {
	t.Helper()
	rs := fwFleet(t, srv, name, n, slots.Unlimited, WithLogger(quiet()))
	for _, r := range rs {
		require.NoError(t, r.Learn("p", a))
	}
	return rs
}

// A concurrency refusal reported by one process lowers the cap of every
// process; an admission one of them reports raises it for all.
func TestLearnedCapIsTheFleets(t *testing.T) {
	srv := redistest.Start(t)
	rs := learnFleet(t, srv, "learn-share", 3, upstream.AdaptiveConfig{Initial: 10, Max: 64})
	for _, r := range rs {
		assert.Equal(t, 10, r.Learned("p").Cap)
	}

	// Ten holders across the fleet; the tenth start is refused upstream.
	held := holdP(t, 10, rs...)
	rs[0].Report(held[9], upstream.Verdict{Kind: upstream.Concurrency})
	for i, r := range rs {
		fwUntil(t, fmt.Sprintf("registry %d learns the cut", i), func() bool {
			l := r.Learned("p")
			return l.Cap == 9 && l.Ceiling == 9
		})
	}
	releaseAll(t, rs[0], held)

	// A test of the cut, admitted: the cut stands, and it is over for all.
	// (A start within the cut number's margin, a few milliseconds, would
	// count as one from before the cut.)
	cut := int64(learnOf(rs[0], "p").cap.CutSeq) * 1000
	fwUntil(t, "the server's clock passes the cut's number", func() bool { return rs[1].clock.nanos() > cut+int64(2*time.Millisecond) })
	s, err := rs[1].TryAcquire("p")
	require.NoError(t, err)
	rs[1].Report(s, upstream.Verdict{Kind: upstream.Admitted})
	releaseAll(t, rs[1], []*slots.Slot{s})
	// The ceiling is retested only after RetestMS (10 s by default): the
	// limit stays at the cap meanwhile, in every process, once each knows
	// the test of the cut is over.
	for i, r := range rs {
		fwUntil(t, fmt.Sprintf("registry %d runs at the cap", i), func() bool {
			return learnOf(r, "p").cap.Streak == 0 && r.Learned("p").Limit == 9
		})
	}
	held = holdP(t, 9, rs[2])
	_, err = rs[0].TryAcquire("p")
	require.ErrorIs(t, err, slots.ErrLimitReached, "nine are in flight across the fleet")
	releaseAll(t, rs[0], held)
	assert.Equal(t, uint64(1), rs[0].Learned("p").ByKind[upstream.Concurrency], "the refusal is counted where it was reported")
	assert.Equal(t, uint64(1), rs[1].Learned("p").ByKind[upstream.Admitted])
}

// releaseAll releases held and waits until Redis counts none on "p" (a
// release reaches Redis in the background).
// holdP takes n slots of key "p", from each of rs in turn, failing the
// test if one is refused.
func holdP(t *testing.T, n int, rs ...*Registry[string]) []*slots.Slot {
	t.Helper()
	held := make([]*slots.Slot, 0, n)
	for i := range n {
		s, err := rs[i%len(rs)].TryAcquire("p")
		require.NoError(t, err, "start %d", i+1)
		held = append(held, s)
	}
	return held
}

func releaseAll(t *testing.T, r *Registry[string], held []*slots.Slot) {
	t.Helper()
	for _, s := range held {
		s.Release()
	}
	fwUntil(t, "the releases reach Redis", func() bool {
		n, err := r.InFlight(context.Background(), "p")
		return err == nil && n == 0
	})
}

// While no ceiling is known, a probe one process makes and reports
// admitted raises the cap of all.
func TestLearnedCapRisesForAll(t *testing.T) {
	srv := redistest.Start(t)
	rs := learnFleet(t, srv, "learn-rise", 3, upstream.AdaptiveConfig{Initial: 4, Max: 64})
	require.Equal(t, 5, rs[0].Learned("p").Limit, "one probe over the cap may go")
	held := holdP(t, 5, rs[0])
	rs[0].Report(held[4], upstream.Verdict{Kind: upstream.Admitted})
	for i, r := range rs {
		fwUntil(t, fmt.Sprintf("registry %d learns the probe", i), func() bool { return r.Learned("p").Cap == 5 })
	}
	for _, s := range held {
		s.Release()
	}
}

// Learn refuses what it cannot learn under, and bad reports change nothing.
func TestLearnEdges(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "learn-edges"), 3)
	defer r.Close()
	require.Error(t, r.Learn("p", upstream.AdaptiveConfig{Min: 5}), "a floor over the configured limit")
	require.Error(t, r.Learn("p", upstream.AdaptiveConfig{Initial: -1}))
	assert.False(t, r.Learned("p").Enabled)
	require.ErrorIs(t, r.Learn("p\xff", upstream.AdaptiveConfig{}), registry.ErrInvalidKey, "a name the stored state cannot carry")
	assert.False(t, r.Learned("p\xff").Enabled)

	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 8}))
	l := r.Learned("p")
	assert.Equal(t, 3, l.Max, "the configured limit is the ceiling")
	assert.Equal(t, 3, l.Cap)

	// Reports that are no evidence: nil, a Slot of another key's only,
	// another Registry's, a second report.
	r.Report(nil, upstream.Verdict{Kind: upstream.Concurrency})
	s, err := r.TryAcquire("q")
	require.NoError(t, err)
	r.Report(s, upstream.Verdict{Kind: upstream.Concurrency})
	s.Release()
	other := New[string](redisstore.New(srv.Client(), "learn-edges-other"), 3)
	defer other.Close()
	s, err = other.TryAcquire("p")
	require.NoError(t, err)
	r.Report(s, upstream.Verdict{Kind: upstream.Concurrency})
	s.Release()
	s, err = r.TryAcquire("p")
	require.NoError(t, err)
	r.Report(s, upstream.Verdict{Kind: upstream.Admitted})
	r.Report(s, upstream.Verdict{Kind: upstream.Concurrency})
	s.Release()
	assert.Equal(t, 3, r.Learned("p").Cap)
	assert.Equal(t, uint64(0), r.Learned("p").ByKind[upstream.Concurrency])

	// SetLimit moves the ceiling; Forget returns the key to its limit.
	r.SetLimit("p", 2)
	assert.Equal(t, 2, r.Learned("p").Cap)
	r.Forget("p")
	assert.False(t, r.Learned("p").Enabled)
	assert.Equal(t, 2, r.Limit("p"))

	r.Close()
	require.ErrorIs(t, r.Learn("p", upstream.AdaptiveConfig{}), ErrClosed)
}

// learnScenario is a run of a fleet learning a hidden cap that moves, in
// real time, shortened: phases of a few seconds, services of a few hundred
// milliseconds.
type learnScenario struct {
	schedule []pacingtest.Step
	phase    time.Duration
	rate     float64 // arrivals a second, across the fleet
	median   time.Duration
	retest   time.Duration
}

// learnResult is what a run saw.
type learnResult struct {
	u        pacingtest.Counts
	turned   int64
	caps     [][]int // per phase, each registry's Cap at its end
	inFlight int64   // most in flight across the fleet by its own count
}

// runLearning drives rs (learning key "p") against a simulated upstream.
func runLearning(t *testing.T, rs []*Registry[string], sc learnScenario) learnResult {
	t.Helper()
	u := &pacingtest.Upstream{Schedule: sc.schedule, RefusalDelay: 10 * time.Millisecond, HeaderDelay: 30 * time.Millisecond}
	u.Start()
	t0 := time.Now()
	var (
		wg     sync.WaitGroup
		turned atomic.Int64
		now    atomic.Int64 // in flight, by the callers' own count
		most   atomic.Int64
		res    learnResult
	)
	rng := rand.New(rand.NewPCG(7, 11))
	end := time.Duration(len(sc.schedule)) * sc.phase
	next := sc.phase
	for i := 0; ; i++ {
		time.Sleep(time.Duration(rng.ExpFloat64() / sc.rate * float64(time.Second))) // the arrivals' schedule
		if time.Since(t0) >= next {
			caps := make([]int, len(rs))
			for j, r := range rs {
				caps[j] = r.Learned("p").Cap
			}
			res.caps = append(res.caps, caps)
			next += sc.phase
		}
		if time.Since(t0) >= end {
			break
		}
		r := rs[i%len(rs)]
		service := time.Duration(float64(sc.median) * math.Exp(rng.NormFloat64()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s, err := r.Acquire(ctx, "p")
			if err != nil {
				turned.Add(1)
				return
			}
			defer s.Release()
			n := now.Add(1)
			defer now.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			req, _ := http.NewRequest(http.MethodPost, "http://upstream.invalid/v1/chat/completions", nil)
			req.Header.Set(pacingtest.ServiceHeader, service.String())
			resp, err := u.RoundTrip(req)
			if err != nil {
				r.Report(s, upstream.Verdict{Kind: upstream.Other})
				return
			}
			r.Report(s, pacing.Classify(resp, nil))
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	res.u, res.turned, res.inFlight = u.Counts(), turned.Load(), most.Load()
	return res
}

// refusedShare is the share of the upstream's attempts answered 429.
func (r learnResult) refusedShare() float64 {
	return float64(r.u.Refused) / float64(max(r.u.Attempts, 1))
}

// logLearning logs what a run of sc by n processes saw.
func logLearning(t *testing.T, sc learnScenario, n int, res learnResult) {
	t.Helper()
	t.Logf("%d processes: %d attempts, %d answered 429 (%.2f%%), %d served, %d turned away, peak %d open upstream, %d in flight by the callers' count",
		n, res.u.Attempts, res.u.Refused, 100*res.refusedShare(), res.u.Served, res.turned, res.u.Peak, res.inFlight)
	for i, caps := range res.caps {
		t.Logf("phase %d: hidden cap %d, learned caps %v", i+1, sc.schedule[i].Cap, caps)
	}
}

// Three processes learn a hidden cap that drops and rises on a real
// redis-server, on a real clock. How well they learn it depends on how busy
// the machine is (TestFleetLearnsAMovingCapVirtual scores it in virtual
// time), so this checks what holds on any machine and logs the figures:
// the fleet never has more in flight than its ceiling (10, under the
// demand and under two of the hidden caps, so that it binds; the processes
// fail closed, since their local fallback would hold 10 each), every
// learned cap stays within its bounds, the processes end with one cap,
// the upstream served work, and nothing is left held.
func TestFleetLearnsAMovingCap(t *testing.T) {
	if testing.Short() {
		t.Skip("a real-time run of 6 s")
	}
	sc := movingCap // with phases of 2 s: its figures are only logged
	sc.phase = 2 * time.Second
	sc.schedule = []pacingtest.Step{{At: 0, Cap: 12}, {At: 2 * time.Second, Cap: 5}, {At: 4 * time.Second, Cap: 15}}
	srv := redistest.Start(t)
	const ceiling = 10
	rs := fwFleet(t, srv, "learn-run", 3, slots.Unlimited, WithLogger(quiet()), WithUnavailable(FailClosed))
	for _, r := range rs {
		require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Max: ceiling, RetestMS: sc.retest.Milliseconds()}))
	}
	res := runLearning(t, rs, sc)
	logLearning(t, sc, len(rs), res)
	require.Len(t, res.caps, len(sc.schedule))
	assert.LessOrEqual(t, res.inFlight, int64(ceiling), "in flight across the fleet, by the callers' count")
	for i, caps := range res.caps {
		for j, c := range caps {
			assert.True(t, c >= 1 && c <= ceiling, "phase %d, registry %d: cap %d out of [1, %d]", i+1, j, c, ceiling)
		}
	}
	fwUntil(t, "the processes agree on the cap", func() bool {
		c := rs[0].Learned("p").Cap
		return rs[1].Learned("p").Cap == c && rs[2].Learned("p").Cap == c
	})
	assert.Positive(t, res.u.Served, "the upstream served work")
	for _, r := range rs {
		fwUntil(t, "nothing held", func() bool {
			n, err := r.InFlight(context.Background(), "p")
			st := r.Stats()
			return err == nil && n == 0 && st.Held == 0 && st.RemovalsPending == 0
		})
	}
}

// A learned cap outlives a Redis that loses its data (kill -9, restarted
// empty): the processes write back what they knew, not the initial cap;
// and while Redis is down each goes on under its copy.
func TestLearnedCapAfterRedisLosesItsData(t *testing.T) {
	srv := redistest.Start(t)
	rs := learnFleet(t, srv, "learn-loss", 2, upstream.AdaptiveConfig{Initial: 10, Max: 64})
	held := holdP(t, 10, rs...)
	rs[1].Report(held[9], upstream.Verdict{Kind: upstream.Concurrency})
	for i, r := range rs {
		fwUntil(t, fmt.Sprintf("registry %d learns the cut", i), func() bool { return r.Learned("p").Cap == 9 })
	}
	for _, s := range held {
		s.Release()
	}

	srv.Kill()
	for _, r := range rs {
		assert.Equal(t, 9, r.Learned("p").Cap, "the copy stands while Redis is down")
	}
	srv.Restart()
	fwUntil(t, "the learned state is back in Redis", func() bool {
		return srv.Client().Exists(context.Background(), "inflight:{learn-loss}#learn:p").Val() == 1
	})
	for _, r := range rs {
		l := r.Learned("p")
		assert.Equal(t, 9, l.Cap, "what the fleet knew, not the initial 10")
		assert.Equal(t, 9, l.Ceiling)
	}
}

// The learned cap's clock keeps the narrowest bounds the replies give: a
// slow reply does not move it; a reply outside the bounds (the clocks moved
// apart) starts them anew.
func TestServerClockNanos(t *testing.T) {
	var c serverClock
	c.base = time.Now().Add(-time.Hour) // local readings about 3,600,000 ms
	at := func(sent, back int64) (int64, int64) { l := c.local(); return l + sent, l + back }
	mid := func() int64 { return c.nanos()/int64(time.Millisecond) - c.local() }

	s, b := at(-10, 10) // a reply that took 20 ms; the server said 5,000,000
	c.seen(5_000_000, s, b)
	assert.InDelta(t, 5_000_000-(s+b)/2, mid(), 1)
	fast := func(off int64) { s, b := at(-1, 0); c.seen(c.local()+off, s, b) }
	fast(1_000) // the server is 1,000 ms ahead, told by a reply of 1 ms
	assert.InDelta(t, 1_000, mid(), 2)
	s, b = at(-200, 0) // a reply that took 200 ms, read late: within the bounds, it changes nothing
	c.seen(c.local()+950, s, b)
	assert.InDelta(t, 1_000, mid(), 2)
	fast(5_000) // the server's clock jumped
	assert.InDelta(t, 5_000, mid(), 2)
}

// A report that cuts the cap has written it to Redis when it returns: the
// Slot's release, which follows, cannot let another process start under
// the cap it knew.
func TestReportWritesACutBeforeItReturns(t *testing.T) {
	srv := redistest.Start(t)
	rs := learnFleet(t, srv, "learn-flush", 1, upstream.AdaptiveConfig{Initial: 3, Max: 64})
	held := holdP(t, 3, rs[0])
	rs[0].Report(held[2], upstream.Verdict{Kind: upstream.Concurrency})
	assert.Empty(t, learnOf(rs[0], "p").pending, "the cut is written when Report returns")
	raw, err := srv.Client().Get(context.Background(), "inflight:{learn-flush}#learn:p").Bytes()
	require.NoError(t, err, "the state is in Redis")
	var st storedCap
	require.NoError(t, json.Unmarshal(raw, &st))
	assert.Equal(t, "p", st.Key)
	assert.Equal(t, 2, st.Cap.Lo, "the cut")
	assert.Equal(t, 2, st.Cap.Hi)
	for _, s := range held {
		s.Release()
	}

	// A message that cannot be read makes the process read the state.
	rs[0].learnedMessage("not json")
	fwUntil(t, "read again", func() bool {
		rs[0].learned.mu.Lock()
		defer rs[0].learned.mu.Unlock()
		return !rs[0].learned.learning["p"].stale
	})
	assert.Equal(t, 2, rs[0].Learned("p").Cap)
}

// A state written by a process whose Max is 4, which has found no
// ceiling, holds 4 as its ceiling (its bound): a process whose Max is 8
// reads no ceiling in it, and its probe at 5, admitted, raises the cap as
// in a fleet of one configuration (TestLearnedCapRisesForAll). It took 4
// for a ceiling found: the probe was a retest, whose admission leaves the
// cap at 4 and proves 5 again.
func TestLearnedCeilingOfANarrowerProcessIsItsBound(t *testing.T) {
	ms := memstore.New()
	narrow := New[string](ms, slots.Unlimited, WithLogger(quiet()))
	defer narrow.Close()
	require.NoError(t, narrow.Learn("p", upstream.AdaptiveConfig{Initial: 4, Max: 4}))
	settled(t, narrow, "p")
	wide := New[string](ms, slots.Unlimited, WithLogger(quiet()))
	defer wide.Close()
	require.NoError(t, wide.Learn("p", upstream.AdaptiveConfig{Initial: 4, Max: 8}))
	settled(t, wide, "p")
	assert.Equal(t, 8, wide.Learned("p").Ceiling, "no refusal found a ceiling")

	held := holdP(t, 5, wide)
	wide.Report(held[4], upstream.Verdict{Kind: upstream.Admitted})
	assert.Equal(t, 5, wide.Learned("p").Cap, "the probe admitted raises the cap")
	for _, s := range held {
		s.Release()
	}
}
