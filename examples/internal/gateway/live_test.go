package gateway

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	simulated "github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

var live = flag.Bool("live", false, "play pacingtest's Drop scenario in full (360 s) through the gateway over loopback, beside its virtual-time figures")

// The learned cap through the gateway, over real sockets and in real time,
// figured as pacingtest scores the Gate in virtual time: the share of 429s,
// the work served against a gateway whose static cap follows the hidden one,
// and how long the cap takes to settle after each change. The same run is
// played in process in virtual time beside it, so that what sockets and
// real time change can be told apart from what the scenario does. The
// scores are asserted in virtual time, where they do not depend on how
// busy the machine is; over sockets, what holds on any machine: every
// request answered, the static cap never exceeded at the upstream, nothing
// left held. The figures of both are logged.
//
// In CI, a shortened Drop (20→8→30, phases of 30 s) with every time a
// tenth as long: 9 s, and the queue's drain after it (13 s in all). The
// full scenario takes six minutes:
//
//	go test ./examples/internal/gateway -run LiveDrop -live -v
func TestGatewayLiveDrop(t *testing.T) {
	sc, scale := pacingtest.Drop, 0.1
	if *live {
		scale = 1
	} else {
		sc.Schedule = []pacingtest.Step{{At: 0, Cap: 20}, {At: 30 * time.Second, Cap: 8}, {At: 60 * time.Second, Cap: 30}}
		sc.Duration = 90 * time.Second
	}
	var learned, static pacingtest.Result
	var wg sync.WaitGroup
	wg.Go(func() { learned = playLive(t, sc, scale, true) })
	wg.Go(func() { static = playLive(t, sc, scale, false) })
	wg.Wait()
	var vLearned, vStatic pacingtest.Result
	testrig.Bubble(t, func(t *testing.T) { vLearned = playInProcess(t, sc, scale, true) })
	testrig.Bubble(t, func(t *testing.T) { vStatic = playInProcess(t, sc, scale, false) })

	var b strings.Builder
	fmt.Fprintf(&b, "%s, times ×%g (settling in the scenario's time)\n", sc.Name, scale)
	fmt.Fprintf(&b, "  over sockets, real time:    %s\n", figures(learned, static))
	fmt.Fprintf(&b, "  in process, virtual time:   %s\n", figures(vLearned, vStatic))
	if *live {
		// The Gate alone, as pacing's own score runs it.
		var gLearned, gStatic pacingtest.Result
		cfg := pacing.Config{MaxQueue: 200, MaxQueueWaitMS: 30_000}
		testrig.Bubble(t, func(t *testing.T) {
			c := cfg
			c.Adaptive = &pacing.AdaptiveConfig{}
			gLearned = pacingtest.Score(sc, c)
		})
		testrig.Bubble(t, func(t *testing.T) {
			gStatic = pacingtest.ScoreFollowing(sc, cfg, func(c int) int { return c - sc.Foreign })
		})
		fmt.Fprintf(&b, "  the Gate alone, virtual:    %s\n", figures(gLearned, gStatic))
	}
	t.Log("\n" + b.String())

	// In virtual time, the learned cap's scores (the Gate's own, over the
	// whole scenario, are bounded in pacing's score).
	assert.Zero(t, vStatic.Upstream.Refused, "the static cap that follows the hidden one, in virtual time")
	assert.LessOrEqual(t, vLearned.RefusedShare(), 0.05, "429s / attempts, learned, in virtual time")
	assert.GreaterOrEqual(t, goodput(vLearned, vStatic), 0.90, "work served against the static cap at the true value, in virtual time")
	// Over sockets, what any machine keeps: the static cap follows the
	// hidden one, and the gateway never sends more than the highest of its
	// caps (the demand is over every one of them).
	maxCap := 0
	for _, st := range sc.Schedule {
		maxCap = max(maxCap, st.Cap-sc.Foreign)
	}
	t.Logf("open at the upstream at most (refused requests too): %d with the static cap, %d learned", static.Upstream.Peak, learned.Upstream.Peak)
	assert.LessOrEqual(t, static.Upstream.Peak, maxCap, "the static cap is never exceeded at the upstream")
	assert.Positive(t, learned.Upstream.Served, "the learned cap lets work through")
}

// figures is a run's line as pacing's score prints it.
func figures(learned, static pacingtest.Result) string {
	d := func(d time.Duration) string {
		if d < 0 {
			return "never"
		}
		return d.Round(100 * time.Millisecond).String()
	}
	var settle []string
	for _, s := range learned.Settle {
		settle = append(settle, d(s))
	}
	return fmt.Sprintf("%5.2f%% 429s (static %.2f%%) | goodput %5.1f%% | %d attempts | settles from the start, after each change: %s",
		100*learned.RefusedShare(), 100*static.RefusedShare(), 100*goodput(learned, static), learned.Upstream.Attempts, strings.Join(settle, ", "))
}

func goodput(learned, static pacingtest.Result) float64 {
	if static.Upstream.Work == 0 {
		return 0
	}
	return float64(learned.Upstream.Work) / float64(static.Upstream.Work)
}

// quiet drops the gateway's log lines: a run makes thousands (each change
// of the learned cap, the queue overflowing), and its figures say the rest.
var quiet = WithLogger(slog.New(slog.DiscardHandler))

// times multiplies the durations of a scenario's run.
type times float64

func (k times) of(d time.Duration) time.Duration { return time.Duration(float64(d) * float64(k)) }

// player plays a scenario through a gateway: send sends one request that
// streams for service and returns its status once its answer has ended.
type player struct {
	sc    pacingtest.Scenario
	k     times
	learn bool
	u     *pacingtest.Upstream
	gw    *Gateway   // the static cap's; the first of gws
	gws   []*Gateway // a fleet's gateways, or gw alone
	send  func(service time.Duration) int

	provider pacing.Config // the gateway's
	limit    atomic.Int64  // the static cap now

	mu      sync.Mutex
	answers map[int]int // requests by the status they were answered with (0: none)
}

// unanswered is the number of requests answered neither 200 nor a
// refusal (429 over a cap, 503 after the queue's wait): an error, or no
// answer at all.
func (p *player) unanswered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for status, c := range p.answers {
		if status != http.StatusOK && status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
			n += c
		}
	}
	return n
}

// held is the number of provider slots the player's gateways hold.
func (p *player) held() int {
	n := 0
	for _, gw := range p.fleet() {
		n += gw.Provider().InFlight
	}
	return n
}

// setup makes the upstream and the gateway's config, as pacing's score
// does: a queue of 200 that waits up to 30 s; learning from the start, or a
// static cap at the hidden one.
func setup(sc pacingtest.Scenario, k times, learn bool) (*pacingtest.Upstream, Config) {
	u := &pacingtest.Upstream{Foreign: sc.Foreign, RefusalDelay: k.of(50 * time.Millisecond), HeaderDelay: k.of(300 * time.Millisecond)}
	for _, s := range sc.Schedule {
		u.Schedule = append(u.Schedule, pacingtest.Step{At: k.of(s.At), Cap: s.Cap})
	}
	p := pacing.Config{MaxQueue: 200, MaxQueueWaitMS: k.of(30 * time.Second).Milliseconds()}
	if learn {
		p.Adaptive = &pacing.AdaptiveConfig{RetestMS: k.of(pacing.DefaultRetest).Milliseconds()}
	} else {
		p.MaxConcurrentRequests = sc.Schedule[0].Cap - sc.Foreign
	}
	return u, Config{Upstream: "http://upstream.invalid", Orgs: OrgsConfig{DefaultLimit: 1 << 20}, Provider: p}
}

// playLive plays sc, its times multiplied by k, through a gateway over
// loopback sockets, in real time.
func playLive(t *testing.T, sc pacingtest.Scenario, k float64, learn bool) pacingtest.Result {
	u, cfg := setup(sc, times(k), learn)
	hidden := simulated.NewHidden(u)
	upSrv := httptest.NewServer(hidden)
	defer upSrv.Close()
	cfg.Upstream = upSrv.URL
	base := &http.Transport{MaxIdleConnsPerHost: 1024}
	defer base.CloseIdleConnections()
	gw, err := New(cfg, base, quiet)
	require.NoError(t, err)
	defer gw.Close()
	gwSrv := httptest.NewServer(gw)
	defer gwSrv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()
	p := &player{sc: sc, k: times(k), learn: learn, u: u, gw: gw, provider: cfg.Provider, send: func(service time.Duration) int {
		a, err := ask(context.Background(), client, gwSrv.URL, service)
		if err != nil {
			return 0
		}
		return a.status
	}}
	res := p.play()
	p.checkInvariants(t)
	// What the gateway sent, as the upstream counts it (refused requests
	// too, from their arrival to their answer): a static cap holds it.
	res.Upstream.Peak = hidden.Peak()
	return res
}

// checkInvariants checks what a run over sockets keeps on any machine:
// every request answered, and no provider slot held once every answer has
// ended.
func (p *player) checkInvariants(t *testing.T) {
	t.Helper()
	assert.Zero(t, p.unanswered(), "requests answered with an error or not at all: %v", p.answers)
	assert.Zero(t, p.held(), "provider slots held after the run")
}

// playInProcess plays the same through a gateway called in process, its
// upstream a RoundTripper: no sockets, so that it runs in a synctest bubble.
func playInProcess(t *testing.T, sc pacingtest.Scenario, k float64, learn bool) pacingtest.Result {
	u, cfg := setup(sc, times(k), learn)
	gw, err := New(cfg, u, quiet)
	require.NoError(t, err)
	defer gw.Close()
	p := &player{sc: sc, k: times(k), learn: learn, u: u, gw: gw, provider: cfg.Provider, send: func(service time.Duration) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
		req.Header.Set(pacingtest.ServiceHeader, service.String())
		rec := httptest.NewRecorder()
		gw.ServeHTTP(rec, req)
		_, _ = io.Copy(io.Discard, rec.Result().Body)
		return rec.Code
	}}
	return p.play()
}

// play runs the scenario as pacingtest's score does (the same arrivals and
// service times for a seed), samples the learned cap, and returns what the
// upstream saw, with settling in the scenario's own time.
func (p *player) play() pacingtest.Result {
	sc, k := p.sc, p.k
	p.answers = map[int]int{}
	p.u.Start()
	t0 := time.Now()
	var wg sync.WaitGroup
	done := make(chan struct{})
	p.limit.Store(int64(p.provider.MaxConcurrentRequests))
	if !p.learn {
		wg.Go(func() { // the static cap follows the hidden one
			for _, s := range sc.Schedule[1:] {
				select {
				case <-time.After(time.Until(t0.Add(k.of(s.At)))):
				case <-done:
					return
				}
				c := p.provider
				c.MaxConcurrentRequests = s.Cap - sc.Foreign
				if err := p.gw.gate.Reconfigure(c); err != nil {
					panic(err)
				}
				p.limit.Store(int64(c.MaxConcurrentRequests))
			}
		})
	}
	var samples []pacingtest.Sample
	wg.Go(func() {
		tick := time.NewTicker(k.of(pacingtest.SampleEvery))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			limit := int(p.limit.Load())
			if l := p.gw.Learned(); l.Enabled {
				limit = l.Cap
			}
			inFlight := 0
			for _, gw := range p.fleet() {
				inFlight += gw.Provider().InFlight
			}
			samples = append(samples, pacingtest.Sample{At: time.Since(t0), Limit: limit, Cap: p.u.Cap() - sc.Foreign,
				InFlight: inFlight, Refused: p.u.Counts().Refused})
		}
	})
	rng := rand.New(rand.NewPCG(sc.Seed, 0x9e3779b97f4a7c15))
	sigma := sc.Sigma
	if sigma == 0 {
		sigma = 1
	}
	var requests sync.WaitGroup
	var next time.Duration // arrivals on their own clock: a late wake-up does not delay the next one
	for {
		next += k.of(time.Duration(rng.ExpFloat64() / sc.Rate * float64(time.Second)))
		time.Sleep(time.Until(t0.Add(next)))
		if next >= k.of(sc.Duration) {
			break
		}
		service := k.of(time.Duration(float64(sc.Median) * math.Exp(sigma*rng.NormFloat64())))
		requests.Go(func() {
			status := p.send(service)
			p.mu.Lock()
			p.answers[status]++
			p.mu.Unlock()
		})
	}
	close(done)
	wg.Wait()
	requests.Wait()
	turned := 0
	for _, gw := range p.fleet() {
		turned += int(gw.Provider().Rejected)
	}
	res := pacingtest.Result{Scenario: sc.Name, Upstream: p.u.Counts(), Turned: turned, Samples: samples}
	res.Settle = settle(sc, k, samples)
	return res
}

// fleet returns the gateways the player sends to.
func (p *player) fleet() []*Gateway {
	if len(p.gws) == 0 {
		return []*Gateway{p.gw}
	}
	return p.gws
}

// settle is pacingtest's measure, on samples taken k times as fast: in the
// scenario's time.
func settle(sc pacingtest.Scenario, k times, samples []pacingtest.Sample) []time.Duration {
	scaled := slices.Clone(samples)
	for i := range scaled {
		scaled[i].At = time.Duration(float64(scaled[i].At) / float64(k))
	}
	return pacingtest.Settle(sc, scaled)
}

// Three gateways on one Redis learn the upstream's cap: the same shortened
// Drop as TestGatewayLiveDrop, over loopback sockets, its arrivals spread
// over the gateways in turn, beside one gateway alone in the same run. Both
// learn from the start, with no configured cap. How well a fleet learns
// depends on how fast Redis answers, so on how busy the machine is: the
// scores are asserted in virtual time (registry/fleet's
// TestFleetLearnsAMovingCapVirtual), and this run checks what holds on any
// machine (every request answered, nothing left held, the gateways ending
// on one cap) and logs its figures. Times go at a tenth of the scenario's
// (13 s); with -live, at half (50 s), as when the README's figures were
// taken.
func TestGatewayFleetLearnsLive(t *testing.T) {
	sc, k := pacingtest.Drop, times(0.1)
	if *live {
		k = 0.5
	}
	sc.Schedule = []pacingtest.Step{{At: 0, Cap: 20}, {At: 30 * time.Second, Cap: 8}, {At: 60 * time.Second, Cap: 30}}
	sc.Duration = 90 * time.Second
	srv := redistest.Start(t)
	play := func(n int) pacingtest.Result {
		u, cfg := setup(sc, k, true)
		// Each run its own fleet: its own database in Redis.
		cfg.Fleet = &FleetConfig{RedisURL: fmt.Sprintf("redis://%s/%d", srv.Addr, n), LeaseTTLMS: 3000}
		cfg.Provider.Adaptive.RetestMS = k.of(pacing.DefaultRetest).Milliseconds()
		upSrv := httptest.NewServer(simulated.NewHidden(u))
		defer upSrv.Close()
		cfg.Upstream = upSrv.URL
		base := &http.Transport{MaxIdleConnsPerHost: 1024}
		defer base.CloseIdleConnections()
		var urls []string
		p := &player{sc: sc, k: k, learn: true, u: u, provider: cfg.Provider}
		for range n {
			gw, err := New(cfg, base, quiet)
			require.NoError(t, err)
			defer gw.Close()
			gwSrv := httptest.NewServer(gw)
			defer gwSrv.Close()
			p.gws = append(p.gws, gw)
			urls = append(urls, gwSrv.URL)
		}
		p.gw = p.gws[0]
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
		defer client.Transport.(*http.Transport).CloseIdleConnections()
		var turn atomic.Int64
		p.send = func(service time.Duration) int {
			a, err := ask(context.Background(), client, urls[int(turn.Add(1))%n], service)
			if err != nil {
				return 0
			}
			return a.status
		}
		res := p.play()
		p.checkInvariants(t)
		// The learned state's messages reach every gateway: they end on
		// one cap.
		deadline := time.Now().Add(5 * time.Second)
		for !oneCap(p.gws) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling a condition
		}
		assert.True(t, oneCap(p.gws), "the gateways end on one learned cap")
		return res
	}
	var one, three pacingtest.Result
	var wg sync.WaitGroup
	wg.Go(func() { one = play(1) })
	wg.Go(func() { three = play(3) })
	wg.Wait()
	line := func(r pacingtest.Result) string {
		var settle []string
		for _, s := range r.Settle {
			settle = append(settle, s.Round(100*time.Millisecond).String())
		}
		return fmt.Sprintf("%5.2f%% 429s | work %5.1f s | %d attempts | settles from the start, after each change: %s",
			100*r.RefusedShare(), r.Upstream.Work.Seconds(), r.Upstream.Attempts, strings.Join(settle, ", "))
	}
	t.Logf("\n%s, times ×%g, learning on one Redis\n  one gateway:    %s\n  three gateways: %s", sc.Name, float64(k), line(one), line(three))

	assert.Positive(t, three.Upstream.Served, "the fleet lets work through")
}

// oneCap reports whether gws know one learned cap.
func oneCap(gws []*Gateway) bool {
	for _, gw := range gws[1:] {
		if gw.Learned().Cap != gws[0].Learned().Cap {
			return false
		}
	}
	return true
}
