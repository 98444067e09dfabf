// Command demo shows the problem inflight solves, over real HTTP, in one
// process.
//
// A simulated provider streams chat completions as server-sent events and,
// like providers with concurrency-limited plans, answers 429 (code 1302) once
// an account has more requests in flight than its limit. A mixed workload
// (long batch turns on a heavy model, short interactive turns on a light one)
// runs twice: straight at the provider, then through the example gateway,
// which caps the provider and the heavy model and queues the rest. A table
// compares the two runs.
//
// Then the batch is let loose on the whole account (no model cap), so that
// it saturates the provider cap, and the workload runs through the gateway
// twice more: with one queue, and with priority classes (interactive
// requests say X-Priority: interactive, the batch org is batch by config,
// and batch keeps a minimum share of one slot). A second table compares the
// interactive latencies.
//
// Last, a provider whose concurrency cap is hidden and moves (20, then 8,
// then 30) is reached through gateways with a static cap of 5, 20 and 40
// and through one that learns the cap from the provider's answers; a third
// table compares the 429s, the work served and the latencies (moving.go).
//
// While each phase runs, a progress line on stderr shows the requests
// ended (completed or failed), those open at the provider and the upstream
// 429s so far. The simulated provider is examples/internal/upstream, which
// ./examples/upstream runs on its own for the gateway.
//
//	go run ./examples/demo [-batch 40] [-interactive 40] [-account-limit 5] [-model-cap 3] [-phase 6s] [-fleet]
//	go run ./examples/demo -h    # every flag
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/inflight-go/inflight/examples/internal/gateway"
	"github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/pacing"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

type request struct {
	interactive bool
	org, model  string
	start, turn time.Duration
	prompt      string // the message sent ("" : none)
	maxTokens   int    // the answer's bound (0: none said)
}

type result struct {
	name                string
	requests, completed int
	refused, peak       int64
	tokenPeak           int64 // the most tokens the provider held at once, in its token mode
	p50, p95, wall      time.Duration
	batchP95            time.Duration // of the batch turns, from start to end
}

// runWorkload sends every request to baseURL (retrying a 429 twice after a
// short back-off, as SDKs do) and measures what the provider saw. With
// classes, interactive requests carry X-Priority: interactive.
func runWorkload(name, baseURL string, p *upstream.Provider, reqs []request, classes bool, progress *progress) result {
	return runSpread(name, []string{baseURL}, p, reqs, classes, progress)
}

// runSpread is runWorkload with the requests spread over several gateways,
// in turn.
func runSpread(name string, baseURLs []string, p *upstream.Provider, reqs []request, classes bool, progress *progress) result {
	return runWith(name, baseURLs, p, reqs, classes, func(total int, done *atomic.Int64) func() {
		return progress.start(name, total, done, p)
	})
}

// runWith is runSpread with its progress line started by show.
func runWith(name string, baseURLs []string, p *upstream.Provider, reqs []request, classes bool, show func(int, *atomic.Int64) func()) result {
	p.ResetCounts()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		batchLat  []time.Duration
		completed int
		done      atomic.Int64
		wg        sync.WaitGroup
	)
	start := time.Now()
	stopProgress := show(len(reqs), &done)
	for i, r := range reqs {
		baseURL := baseURLs[i%len(baseURLs)]
		wg.Go(func() {
			time.Sleep(r.start) // the workload's own schedule
			began := time.Now()
			ok := false
			for attempt := 0; attempt < 3 && !ok; attempt++ {
				ok = send(client, baseURL, r, classes)
				if !ok {
					time.Sleep(50 * time.Millisecond)
				}
			}
			took := time.Since(began)
			done.Add(1)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case !ok: // a failed turn's latency would flatter its run
			case r.interactive:
				completed++
				latencies = append(latencies, took)
			default:
				completed++
				batchLat = append(batchLat, took)
			}
		})
	}
	wg.Wait()
	stopProgress()
	slices.Sort(latencies)
	slices.Sort(batchLat)
	counts := p.Counts()
	return result{
		name: name, requests: len(reqs), completed: completed,
		refused: counts.Refused, peak: counts.Peak, tokenPeak: counts.TokenPeak,
		p50: percentile(latencies, 50), p95: percentile(latencies, 95),
		wall: time.Since(start), batchP95: percentile(batchLat, 95),
	}
}

// send streams one turn to its end and reports whether it completed.
func send(client *http.Client, baseURL string, r request, classes bool) bool {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"turn_ms":%d`, r.model, r.turn.Milliseconds())
	if r.prompt != "" {
		body += fmt.Sprintf(`,"messages":[{"role":"user","content":%q}]`, r.prompt)
	}
	if r.maxTokens > 0 {
		body += fmt.Sprintf(`,"max_tokens":%d`, r.maxTokens)
	}
	body += "}"
	req, err := http.NewRequest(http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Org-ID", r.org)
	if classes && r.interactive {
		req.Header.Set("X-Priority", "interactive")
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK && strings.HasSuffix(string(data), "data: [DONE]\n\n")
}

// percentile is the nearest rank: the smallest latency that p% of them
// do not exceed (of six, the 95th is the slowest, not the second slowest).
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[max((len(sorted)*p+99)/100-1, 0)]
}

// outcome is what the demo measured, for its test.
type outcome struct {
	direct, capped, oneQueue, classes, perProcess, fleet result
	tokensDirect, tokensCapped, tokensFleet              result         // the token run's
	moving                                               []movingResult // static caps of 5, 20, 40, then the learned one
}

var lastOutcome outcome

// maxPhase bounds -phase: each phase's arrivals are made up front.
const maxPhase = 10 * time.Minute

// maxScale bounds -scale: the workload's longest duration, 1.5 s, scaled,
// stays far inside a time.Duration.
const maxScale = 1000

// run runs the demo: tables on stdout; usage and a progress line per phase
// on stderr.
func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./examples/demo [flags]\n\nThe problem and the fix, side by side, over real HTTP in one process.\n\n")
		fs.PrintDefaults()
	}
	var (
		batch        = fs.Int("batch", 40, "long batch turns on the heavy model")
		interactive  = fs.Int("interactive", 40, "short interactive turns on the light model")
		accountLimit = fs.Int("account-limit", 5, "requests the provider allows in flight per account")
		modelCap     = fs.Int("model-cap", 3, "the gateway's cap on the heavy model, within the account limit")
		scale        = fs.Float64("scale", 1, "multiplies every duration of the workload")
		seed         = fs.Uint64("seed", 1, "workload seed")
		phase        = fs.Duration("phase", 6*time.Second, "how long the moving hidden cap stays at each of 20, 8 and 30 (0 skips that part)")
		cache        = fs.Int("tokens", 20000, "the token run: the tokens in flight a self-hosted server holds (its cache) before it answers 429 (0 skips that part)")
		fleetRun     fleetFlag
	)
	fs.Var(&fleetRun, "fleet", "also run three gateways, first each with its own caps, then sharing them on a store started here: -fleet or -fleet=redis, a redis-server (needs its binary); -fleet=postgres, a PostgreSQL cluster (needs initdb and postgres)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError{err}
	}
	// -fleet is a boolean flag, so "-fleet postgres" is -fleet (Redis)
	// followed by an argument: refused, rather than run on Redis.
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q (a flag's value follows it after =, as in -fleet=postgres)", fs.Arg(0))}
	}
	if *batch < 0 || *interactive < 0 || *accountLimit < 1 || *modelCap < 1 || !(*scale > 0 && *scale <= maxScale) || *phase < 0 || *phase > maxPhase ||
		*cache < 0 || (*cache > 0 && *cache < minCache) || *cache > maxCache {
		return usageError{fmt.Errorf("-batch and -interactive must be >= 0, -account-limit and -model-cap >= 1, -scale in (0, %d], -phase in [0, %v], -tokens 0 or in [%d, %d]",
			maxScale, maxPhase, minCache, maxCache)}
	}
	d := func(ms int) time.Duration { return time.Duration(float64(ms) * *scale * float64(time.Millisecond)) }
	rng := rand.New(rand.NewPCG(*seed, 0))
	var reqs []request
	for range *batch {
		reqs = append(reqs, request{org: "batch-jobs", model: "glm-5", start: d(rng.IntN(400)), turn: d(300 + rng.IntN(500))})
	}
	for range *interactive {
		reqs = append(reqs, request{interactive: true, org: "interactive", model: "glm-4-air", start: d(rng.IntN(1500)), turn: d(40 + rng.IntN(80))})
	}

	prov := upstream.New(*accountLimit)
	provURL, stopProv, err := serve(prov)
	if err != nil {
		return err
	}
	defer stopProv()
	capped := pacing.Config{
		MaxConcurrentRequests: *accountLimit,
		MaxQueue:              len(reqs),
		Models:                map[string]pacing.ModelConfig{"glm-5": {MaxConcurrentRequests: min(*modelCap, *accountLimit)}},
	}
	// The batch on the whole account: one queue, then priority classes.
	loose := pacing.Config{MaxConcurrentRequests: *accountLimit, MaxQueue: len(reqs)}
	withShares := loose
	withShares.Shares = map[string]pacing.ShareConfig{"batch": {Min: 1}}

	progress := newProgress(stderr)
	fmt.Fprintf(stdout, "a provider that allows %d requests in flight per account and answers 429 past them;\n"+
		"%d batch turns of %v-%v on the heavy model glm-5, %d interactive turns of %v-%v on glm-4-air\n\n"+
		"  direct               every request goes straight to the provider; a client retries a 429\n"+
		"                       twice, 50 ms apart, as SDKs do, so one request may draw three 429s\n"+
		"  through the gateway  the gateway caps the provider at %d and glm-5 at %d, and queues\n"+
		"                       the rest (up to %d) until a slot frees\n\n",
		*accountLimit, *batch, d(300), d(800), *interactive, d(40), d(120),
		*accountLimit, min(*modelCap, *accountLimit), len(reqs))
	var out outcome
	out.direct = runWorkload("direct", provURL, prov, reqs, false, progress)
	runs := []struct {
		res     *result
		name    string
		cfg     pacing.Config
		classes bool
	}{
		{&out.capped, "through the gateway", capped, false},
		{&out.oneQueue, "one queue", loose, false},
		{&out.classes, "priority classes", withShares, true},
	}
	for _, r := range runs {
		orgs := gateway.OrgsConfig{DefaultLimit: len(reqs)} // the tenant cap is not what this shows
		if r.classes {
			orgs.Priorities = map[string]string{"batch-jobs": "batch"}
		}
		res, err := runGateway(gateway.Config{Upstream: provURL, Orgs: orgs, Provider: r.cfg},
			func(gwURL string) result { return runWorkload(r.name, gwURL, prov, reqs, r.classes, progress) })
		if err != nil {
			return err
		}
		*r.res = res
	}
	lastOutcome = out

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\trequests\tcompleted\tupstream 429s\tpeak open at provider\tinteractive p50\tinteractive p95\twall time\t")
	for _, r := range []result{out.direct, out.capped} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%v\t%v\t%v\t\n", r.name, r.requests, r.completed, r.refused, r.peak,
			r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.wall.Round(10*time.Millisecond))
	}
	tw.Flush()
	fmt.Fprint(stdout, `
  completed              requests answered 200 and streamed to their end
  upstream 429s          the provider's refusals, retries included
  peak open at provider  the most requests the provider had open at once, refused ones included
  interactive p50, p95   latencies of the completed interactive turns, from the first attempt to the end
`)
	fmt.Fprintf(stdout, "\nthe batch on the whole account (no model cap), through the gateway capped at %d:\n"+
		"  one queue         every request waits in arrival order\n"+
		"  priority classes  interactive requests say X-Priority: interactive and go first;\n"+
		"                    the batch org is batch by config and keeps a minimum of 1 slot\n\n", *accountLimit)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcompleted\tupstream 429s\tpeak open at provider\tinteractive p50\tinteractive p95\tbatch p95\twall time\t")
	for _, r := range []result{out.oneQueue, out.classes} {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%v\t%v\t%v\t%v\t\n", r.name, r.completed, r.requests, r.refused, r.peak,
			r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.batchP95.Round(time.Millisecond), r.wall.Round(10*time.Millisecond))
	}
	tw.Flush()
	fmt.Fprint(stdout, "\n  batch p95  the 95th percentile latency of the completed batch turns; the other columns as above\n")
	// With -fleet, one store for the fleet's runs (the moving cap's and
	// the three gateways').
	var store *fleetStore
	if fleetRun != "" {
		st, stop, err := startStore(string(fleetRun))
		if err != nil {
			fmt.Fprintf(stdout, "\nthe fleet's runs are skipped: %v\n", err)
		} else {
			defer untilSignal(stop)()
			store = st
		}
	}
	if *cache > 0 {
		if err := runTokens(stdout, *cache, d, rng, store, progress, &out); err != nil {
			return err
		}
		lastOutcome = out
	}
	if *phase > 0 {
		if out.moving, err = runMoving(stdout, *phase, *seed, store, progress); err != nil {
			return err
		}
		lastOutcome = out
	}
	if store != nil {
		if err := runFleet(stdout, provURL, store, prov, reqs, withShares, progress, &out); err != nil {
			return err
		}
		lastOutcome = out
	}
	for _, r := range []result{out.capped, out.oneQueue, out.classes, out.tokensCapped, out.tokensFleet} {
		if r.requests != 0 && (r.refused != 0 || r.completed != r.requests) {
			return fmt.Errorf("%s: the runs through the gateway should see no 429s and complete every request", r.name)
		}
	}
	return nil
}

// runGateway starts a gateway for cfg, runs work against its URL, and checks
// that it holds nothing afterwards.
func runGateway(cfg gateway.Config, work func(gwURL string) result) (result, error) {
	return runGateways(1, cfg, func(urls []string) result { return work(urls[0]) })
}

// warnings is the demo's gateways' logger: their warnings on stderr,
// without the access line of each request.
var warnings = gateway.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

// runGateways is runGateway with n gateways of cfg.
func runGateways(n int, cfg gateway.Config, work func(urls []string) result) (result, error) {
	upstream := &http.Transport{MaxIdleConnsPerHost: 256}
	defer upstream.CloseIdleConnections()
	var gws []*gateway.Gateway
	var urls []string
	for range n {
		gw, err := gateway.New(cfg, upstream, warnings)
		if err != nil {
			return result{}, err
		}
		defer gw.Close()
		gwURL, stopGW, err := serve(gw)
		if err != nil {
			return result{}, err
		}
		defer stopGW()
		gws, urls = append(gws, gw), append(urls, gwURL)
	}
	res := work(urls)
	for _, gw := range gws {
		if gw.TenantKeys() != 0 || gw.Provider().InFlight != 0 {
			return res, errors.New("slots still held after the run")
		}
	}
	return res, nil
}

// serve runs h on a loopback port and returns its URL and a stop function.
func serve(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// runFleet runs the workload over three gateways, with priority classes as
// in the one-gateway run of caps (the batch org's turns are batch): each
// with its own caps (the account sees up to three times the cap), then all
// three sharing their caps on one store.
func runFleet(stdout io.Writer, provURL string, store *fleetStore, prov *upstream.Provider, reqs []request, caps pacing.Config, progress *progress, out *outcome) error {
	shared := "caps on one " + store.label
	fmt.Fprintf(stdout, "\nthree gateways, the requests spread over them in turn, with the priority classes above:\n"+
		"  %-*s  each caps the provider at %d on its own: together they allow three times that\n"+
		"  %-*s  the three share their caps and one queue on %s\n\n",
		len(shared), "caps per gateway", caps.MaxConcurrentRequests, len(shared), shared, store.server)
	orgs := gateway.OrgsConfig{DefaultLimit: len(reqs), Priorities: map[string]string{"batch-jobs": "batch"}}
	for _, run := range []struct {
		res   *result
		name  string
		fleet *gateway.FleetConfig
	}{
		{&out.perProcess, "caps per gateway", nil},
		{&out.fleet, shared, store.shared},
	} {
		var urls []string
		for range 3 {
			upstream := &http.Transport{MaxIdleConnsPerHost: 256}
			defer upstream.CloseIdleConnections()
			gw, err := gateway.New(gateway.Config{Upstream: provURL, Orgs: orgs, Provider: caps, Fleet: run.fleet}, upstream, warnings)
			if err != nil {
				return err
			}
			defer gw.Close()
			u, stop, err := serve(gw)
			if err != nil {
				return err
			}
			defer stop()
			urls = append(urls, u)
		}
		*run.res = runSpread(run.name, urls, prov, reqs, true, progress)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcompleted\tupstream 429s\tpeak open at provider\tinteractive p50\tinteractive p95\tbatch p95\twall time\t")
	for _, r := range []result{out.perProcess, out.fleet} {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%v\t%v\t%v\t%v\t\n", r.name, r.completed, r.requests, r.refused, r.peak,
			r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.batchP95.Round(time.Millisecond), r.wall.Round(10*time.Millisecond))
	}
	tw.Flush()
	if out.fleet.refused != 0 || out.fleet.completed != out.fleet.requests {
		return errors.New("the gateways sharing their caps should see no 429s and complete every request")
	}
	return nil
}
