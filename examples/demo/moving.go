package main

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/inflight-go/inflight/examples/internal/gateway"
	"github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
)

// The demo's last part: a provider whose concurrency cap is hidden and
// moves (20, then 8, then 30 requests in flight), under more demand than
// any of them, reached through gateways with a static cap (a guess too
// low, one right for the first phase only, one too high) and through one
// that learns the cap from the provider's answers ("adaptive"). It is
// pacing/pacingtest's Drop scenario with every time a tenth as long, and
// each phase as long as -phase. The four runs go at once, each against a
// provider of its own, with the same arrivals. With -fleet a fifth run
// learns the cap with three gateways sharing it on one store, the turns
// spread over them in turn.

// The moving cap's workload: Poisson arrivals of lognormal turns.
const (
	movingRate   = 120 // arrivals a second
	movingMedian = 200 * time.Millisecond
)

var movingCaps = []int{20, 8, 30}

// movingResult is what one gateway made of the moving cap.
type movingResult struct {
	name                string
	requests, completed int
	attempts, refused   int // at the provider
	turned              int // turned away by the gateway: queue full, or waited too long
	used                float64
	p50, p95            time.Duration
	learnedAt           []int // the learned cap at the end of each phase; nil for a static cap
	static              int   // the static cap; 0 for a learned one
	peak                int   // the most requests open at the provider at once, refused ones too
}

// refusedShare is the share of the provider's attempts answered 429.
func (r movingResult) refusedShare() float64 {
	if r.attempts == 0 {
		return 0
	}
	return float64(r.refused) / float64(r.attempts)
}

type turn struct {
	at, service time.Duration
}

// runMoving runs the moving cap's part with phases of phase each, prints
// its table, and returns its results, the learned cap's last.
func runMoving(stdout io.Writer, phase time.Duration, seed uint64, store *fleetStore, progress *progress) ([]movingResult, error) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	window := time.Duration(len(movingCaps)) * phase
	var turns []turn
	for at := time.Duration(0); ; {
		at += time.Duration(rng.ExpFloat64() / movingRate * float64(time.Second))
		if at >= window {
			break
		}
		turns = append(turns, turn{at, time.Duration(float64(movingMedian) * math.Exp(rng.NormFloat64()))})
	}
	fmt.Fprintf(stdout, "\na provider whose cap is hidden and moves: %s in flight, %v each; %d turns (%d a second, median %v), clients not retrying\n\n",
		joinInts(movingCaps, " → "), phase, len(turns), movingRate, movingMedian)

	// A turn waits at most half a phase for the gateway's cap: 3 s in the
	// default run, as pacing's score waits 30 s with every time ten times
	// as long.
	queue := pacing.Config{MaxQueue: 200, MaxQueueWaitMS: max(phase.Milliseconds()/2, 1)}
	type run struct {
		name     string
		cfg      pacing.Config
		gateways int
		fleet    *gateway.FleetConfig
	}
	runs := []run{
		{"static cap 5", withCap(queue, 5), 1, nil},
		{"static cap 20", withCap(queue, 20), 1, nil},
		{"static cap 40", withCap(queue, 40), 1, nil},
	}
	if store != nil {
		runs = append(runs, run{"learned, 3 gateways, one " + store.label, withAdaptive(queue), 3, store.moving})
	}
	runs = append(runs, run{"learned (adaptive)", withAdaptive(queue), 1, nil})
	results := make([]movingResult, len(runs))
	hidden := make([]*upstream.Hidden, len(runs))
	errs := make([]error, len(runs))
	var (
		done  atomic.Int64
		start sync.WaitGroup
		wg    sync.WaitGroup
	)
	start.Add(len(runs))
	began := make(chan struct{})
	for i, r := range runs {
		wg.Go(func() {
			results[i], errs[i] = runMovingOne(r.name, r.cfg, r.gateways, r.fleet, phase, turns, &done, func(h *upstream.Hidden) {
				hidden[i] = h
				start.Done()
				<-began
			})
		})
	}
	start.Wait() // one progress line for the four runs, once each has its provider
	// Each run has its own provider: the line names each run's figures.
	stop := progress.startWith(fmt.Sprintf("hidden cap moving, the %d runs together", len(runs)), len(runs)*len(turns), &done, func() string {
		var each []string
		for i, h := range hidden {
			each = append(each, fmt.Sprintf("%s: %d open, %d 429s", runs[i].name, h.Open(), h.U.Counts().Refused))
		}
		return "at each run's provider now (" + strings.Join(each, "; ") + ")"
	})
	close(began)
	wg.Wait()
	stop()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcompleted\tupstream 429s\tof attempts\tturned away\tcapacity used\tp50 latency\tp95 latency\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%.1f%%\t%d\t%.1f%%\t%v\t%v\t\n", r.name, r.completed, r.requests, r.refused, 100*r.refusedShare(),
			r.turned, 100*r.used, r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond))
	}
	tw.Flush()
	fmt.Fprintf(stdout, `
  completed      turns streamed to their end, of those sent to the run's gateway
  upstream 429s  the provider's refusals within the %v of the phases (the progress
                 line counts on while the queues drain), passed on to the clients,
                 who do not retry
  of attempts    those 429s as a share of the requests that reached the provider then
  turned away    turns the gateway refused itself: its queue full, or %v waited
  capacity used  the work the provider served, as a share of its hidden cap
                 times the %v of the phases
  p50, p95       latencies of the completed turns, from arrival to the stream's end
`, window, time.Duration(queue.MaxQueueWaitMS)*time.Millisecond, window)
	for _, r := range results {
		if r.learnedAt != nil {
			fmt.Fprintf(stdout, "\n%s: the learned cap at the end of each phase: %s (the hidden cap: %s)",
				r.name, joinInts(r.learnedAt, ", "), joinInts(movingCaps, ", "))
		}
	}
	fmt.Fprintln(stdout)
	return results, nil
}

func joinInts(ns []int, sep string) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, sep)
}

func withCap(c pacing.Config, n int) pacing.Config {
	c.MaxConcurrentRequests = n
	return c
}

// withAdaptive learns the cap, retesting a ceiling every second (a tenth of
// the default, as every time here is).
func withAdaptive(c pacing.Config) pacing.Config {
	c.Adaptive = &pacing.AdaptiveConfig{RetestMS: 1000}
	return c
}

// runMovingOne plays turns through n gateways under cfg (and fleet, if not
// nil), in turn, in front of a provider of their own. ready is called with
// the provider once it serves, and returns when the run may start.
func runMovingOne(name string, cfg pacing.Config, n int, fleet *gateway.FleetConfig, phase time.Duration, turns []turn, done *atomic.Int64, ready func(*upstream.Hidden)) (movingResult, error) {
	u := &pacingtest.Upstream{RefusalDelay: 5 * time.Millisecond, HeaderDelay: 30 * time.Millisecond}
	for i, c := range movingCaps {
		u.Schedule = append(u.Schedule, pacingtest.Step{At: time.Duration(i) * phase, Cap: c})
	}
	h := upstream.NewHidden(u)
	provURL, stopProv, err := serve(h)
	if err != nil {
		ready(h)
		return movingResult{}, err
	}
	defer stopProv()
	base := &http.Transport{MaxIdleConnsPerHost: 512}
	defer base.CloseIdleConnections()
	// The table says what happened; the gateway's log lines (each change
	// of the learned cap, the queue overflowing) would drown it.
	quiet := gateway.WithLogger(slog.New(slog.DiscardHandler))
	var (
		gws   []*gateway.Gateway
		gwURL []string
	)
	for range n {
		gw, err := gateway.New(gateway.Config{Upstream: provURL, Orgs: gateway.OrgsConfig{DefaultLimit: len(turns)}, Provider: cfg, Fleet: fleet}, base, quiet)
		if err != nil {
			ready(h)
			return movingResult{}, err
		}
		defer gw.Close()
		u, stopGW, err := serve(gw)
		if err != nil {
			ready(h)
			return movingResult{}, err
		}
		defer stopGW()
		gws, gwURL = append(gws, gw), append(gwURL, u)
	}
	gw := gws[0]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()
	ready(h)

	res := movingResult{name: name, requests: len(turns)}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		wg        sync.WaitGroup
	)
	u.Start()
	t0 := time.Now()
	// The learned cap just before each change, and what the provider
	// served within the phases: the last phase's figures are taken at its
	// end, however long the queue takes to drain after it.
	var (
		learnedAt []int
		counts    pacingtest.Counts
	)
	windowEnd := make(chan struct{})
	go func() {
		defer close(windowEnd)
		for i := range movingCaps {
			end := time.Duration(i+1) * phase
			time.Sleep(time.Until(t0.Add(end - min(100*time.Millisecond, phase/10))))
			if l := gw.Learned(); l.Enabled {
				learnedAt = append(learnedAt, l.Cap)
			}
		}
		time.Sleep(time.Until(t0.Add(time.Duration(len(movingCaps)) * phase)))
		counts = u.Counts()
	}()
	for i, tn := range turns {
		time.Sleep(time.Until(t0.Add(tn.at))) // arrivals on their own clock
		wg.Go(func() {
			began := time.Now()
			ok := sendTurn(client, gwURL[i%n], tn.service)
			took := time.Since(began)
			done.Add(1)
			if ok {
				mu.Lock()
				res.completed++
				latencies = append(latencies, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	<-windowEnd
	res.learnedAt = learnedAt
	res.attempts, res.refused, res.peak = counts.Attempts, counts.Refused, h.Peak()
	res.static = cfg.MaxConcurrentRequests
	for _, gw := range gws {
		res.turned += int(gw.TurnedAway())
	}
	slices.Sort(latencies)
	res.p50, res.p95 = percentile(latencies, 50), percentile(latencies, 95)
	capacity := time.Duration(0)
	for _, c := range movingCaps {
		capacity += time.Duration(c) * phase
	}
	res.used = float64(counts.Work) / float64(capacity)
	for _, gw := range gws {
		if gw.TenantKeys() != 0 || gw.Provider().InFlight != 0 {
			return res, fmt.Errorf("%s: slots still held after the run", name)
		}
	}
	return res, nil
}

// sendTurn sends one turn that streams for service and reports whether it
// completed.
func sendTurn(client *http.Client, baseURL string, service time.Duration) bool {
	req, err := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(pacingtest.ServiceHeader, service.String())
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK && strings.HasSuffix(string(data), "data: [DONE]\n\n")
}
