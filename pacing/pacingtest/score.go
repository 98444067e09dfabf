package pacingtest

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// Scenario is a run to score: Poisson arrivals at Rate a second for
// Duration, each streaming for a lognormal time (median Median, shape
// Sigma), against an Upstream whose cap follows Schedule.
type Scenario struct {
	Name     string
	Schedule []Step
	Duration time.Duration
	Rate     float64 // arrivals a second
	Median   time.Duration
	Sigma    float64       // of the service time's logarithm; 1 when 0
	Foreign  int           // the other client's requests always in flight
	EndDelay time.Duration // see Upstream.EndDelay
	// RefusalSigma spreads the refusals' times (see Upstream.RefusalSigma).
	RefusalSigma float64
	Seed         uint64
}

// The scenarios of the learned cap's goals, and Varied. Demand exceeds
// every cap (the mean service time is Median·e^(Sigma²/2), 1.65 Median at
// Sigma 1), so the learner has a cap to find in every phase.
var (
	// Drop: the hidden cap is 20, then 8, then 30, 120 s each; 12 arrivals a
	// second of median 2 s (about 40 wanted in flight).
	Drop = Scenario{Name: "20→8→30", Schedule: []Step{{0, 20}, {120 * time.Second, 8}, {240 * time.Second, 30}},
		Duration: 360 * time.Second, Rate: 12, Median: 2 * time.Second, Sigma: 1, Seed: 1}
	// Shared: Drop with 2 requests of another client always in flight.
	Shared = Scenario{Name: "20→8→30, 2 foreign", Schedule: Drop.Schedule,
		Duration: Drop.Duration, Rate: Drop.Rate, Median: Drop.Median, Sigma: 1, Foreign: 2, Seed: 1}
	// Lagged: Drop over a network whose answers' ends reach the client
	// 20 ms after the provider has let them go (see Upstream.EndDelay):
	// a count the client saw admitted may be one or two over what the
	// provider had.
	Lagged = Scenario{Name: "20→8→30, ends 20 ms late", Schedule: Drop.Schedule,
		Duration: Drop.Duration, Rate: Drop.Rate, Median: Drop.Median, Sigma: 1, EndDelay: 20 * time.Millisecond, Seed: 1}
	// Varied: Drop with the refusals' times spread as over a network,
	// median 50 ms and a tenth over 130 ms (see Upstream.RefusalSigma): a
	// probe whose refusal is slow is not yet refused when one whose
	// refusal is quick would be.
	Varied = Scenario{Name: "20→8→30, refusals vary", Schedule: Drop.Schedule,
		Duration: Drop.Duration, Rate: Drop.Rate, Median: Drop.Median, Sigma: 1, RefusalSigma: 0.75, Seed: 1}
	// Fast: caps 50, 10, 60; 40 arrivals a second of median 1 s (about 66
	// wanted in flight).
	Fast = Scenario{Name: "fast 50→10→60", Schedule: []Step{{0, 50}, {120 * time.Second, 10}, {240 * time.Second, 60}},
		Duration: 360 * time.Second, Rate: 40, Median: time.Second, Sigma: 1, Seed: 1}
)

// Sample is the state at one moment of a run.
type Sample struct {
	At       time.Duration
	Limit    int // the Gate's provider cap (learned or configured)
	Cap      int // the hidden cap less the other client's requests: the room there was
	InFlight int
	Refused  int // 429s so far
}

// Result is what a run did.
type Result struct {
	Scenario string
	Upstream Counts
	Turned   int // turned away by the Gate (queue full or wait timeout)
	// Settle is, per change of the schedule (the first is the start), how
	// long until the limit stayed within one of the room there was up to
	// the next change; -1 if it never did.
	Settle  []time.Duration
	Samples []Sample // every SampleEvery
}

// SampleEvery is how often a run samples the Gate.
const SampleEvery = 100 * time.Millisecond

// RefusedShare is the share of the upstream's attempts answered 429.
func (r Result) RefusedShare() float64 {
	if r.Upstream.Attempts == 0 {
		return 0
	}
	return float64(r.Upstream.Refused) / float64(r.Upstream.Attempts)
}

func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d attempts, %d answered 429 (%.2f%%), %d served, %d turned away; settle:",
		r.Scenario, r.Upstream.Attempts, r.Upstream.Refused, 100*r.RefusedShare(), r.Upstream.Served, r.Turned)
	for _, s := range r.Settle {
		if s < 0 {
			b.WriteString(" never")
		} else {
			fmt.Fprintf(&b, " %v", s.Round(100*time.Millisecond))
		}
	}
	return b.String()
}

// Score runs sc against a Gate under cfg and returns what happened. Run it
// inside a testing/synctest bubble: it takes sc.Duration of the bubble's
// time.
func Score(sc Scenario, cfg pacing.Config) Result { return run(sc, cfg, nil) }

// ScoreFollowing is Score with the Gate's max_concurrent_requests set to
// capOf(hidden cap) at each change of the schedule: a baseline that knows
// the hidden cap.
func ScoreFollowing(sc Scenario, cfg pacing.Config, capOf func(hidden int) int) Result {
	return run(sc, cfg, capOf)
}

func run(sc Scenario, cfg pacing.Config, capOf func(int) int) Result {
	u := &Upstream{Schedule: sc.Schedule, Foreign: sc.Foreign, EndDelay: sc.EndDelay, RefusalSigma: sc.RefusalSigma, Seed: sc.Seed}
	if capOf != nil && len(sc.Schedule) > 0 {
		cfg.MaxConcurrentRequests = capOf(sc.Schedule[0].Cap)
	}
	gate, err := pacing.NewGate("upstream", cfg)
	if err != nil {
		panic("pacingtest: " + err.Error())
	}
	defer gate.Close()
	u.Start()
	t0 := time.Now()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		turned int
	)
	done := make(chan struct{})

	if capOf != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, s := range sc.Schedule[1:] {
				time.Sleep(time.Until(t0.Add(s.At)))
				c := cfg
				c.MaxConcurrentRequests = capOf(s.Cap)
				if err := gate.Reconfigure(c); err != nil {
					panic("pacingtest: " + err.Error())
				}
			}
		}()
	}
	var samples []Sample
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(SampleEvery)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
			}
			st := gate.Status()
			limit := cfg.MaxConcurrentRequests
			if l := gate.Learned(); l.Enabled {
				limit = l.Cap
			} else if capOf != nil {
				limit = capOf(u.Cap())
			}
			samples = append(samples, Sample{At: time.Since(t0), Limit: limit, Cap: u.Cap() - sc.Foreign, InFlight: st.InFlight, Refused: u.Counts().Refused})
		}
	}()

	rng := rand.New(rand.NewPCG(sc.Seed, 0x9e3779b97f4a7c15))
	sigma := sc.Sigma
	if sigma == 0 {
		sigma = 1
	}
	for {
		time.Sleep(time.Duration(rng.ExpFloat64() / sc.Rate * float64(time.Second)))
		if time.Since(t0) >= sc.Duration {
			break
		}
		service := time.Duration(float64(sc.Median) * math.Exp(sigma*rng.NormFloat64()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !request(gate, u, service) {
				mu.Lock()
				turned++
				mu.Unlock()
			}
		}()
	}
	close(done)
	<-sampled
	wg.Wait()
	return Result{Scenario: sc.Name, Upstream: u.Counts(), Turned: turned, Samples: samples, Settle: Settle(sc, samples)}
}

// request sends one request through gate, and reports whether the Gate
// admitted it.
func request(gate *pacing.Gate, u *Upstream, service time.Duration) bool {
	gr, err := gate.Acquire(context.Background(), "model")
	if err != nil {
		return false
	}
	req, _ := http.NewRequest(http.MethodPost, "http://upstream.invalid/v1/chat/completions", nil)
	req.Header.Set(ServiceHeader, service.String())
	resp, err := u.RoundTrip(req)
	if err != nil {
		gr.Slot.Release()
		return true
	}
	gate.Report(gr, pacing.Classify(resp, nil))
	body := slots.WrapBody(resp.Body, gr.Slot)
	_, _ = io.Copy(io.Discard, body)
	body.Close()
	return true
}

// Settle measures, per phase of sc's schedule, how long from its start the
// limit in samples took to stay within one of the room there was up to the
// next change; -1 if it never did (Result.Settle).
func Settle(sc Scenario, samples []Sample) []time.Duration {
	out := make([]time.Duration, len(sc.Schedule))
	for i, st := range sc.Schedule {
		end := sc.Duration
		if i+1 < len(sc.Schedule) {
			end = sc.Schedule[i+1].At
		}
		out[i] = -1
		var since time.Duration = -1
		for _, s := range samples {
			if s.At < st.At || s.At >= end {
				continue
			}
			if d := s.Limit - (st.Cap - sc.Foreign); d >= -1 && d <= 1 {
				if since < 0 {
					since = s.At
				}
			} else {
				since = -1
			}
		}
		if since >= 0 {
			out[i] = since - st.At
		}
	}
	return out
}
