// Command demo shows the problem inflight solves, in one process.
//
// A simulated provider lets an account have a few requests in flight at once
// and answers 429 beyond that, as LLM providers with concurrency-limited plans
// do. A mixed workload (long batch turns on a heavy model, short interactive
// turns on a light one) runs twice: straight at the provider, then through a
// registry.AcquireAll over a provider cap and a model cap. The table compares
// the runs.
//
//	go run ./examples/demo [-batch 40] [-interactive 40] [-account-limit 5]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// provider is the simulated upstream: an account-wide cap on requests in
// flight, enforced by refusing, like a provider's 429 (code 1302).
type provider struct {
	limit    int64
	inFlight atomic.Int64
	peak     atomic.Int64
	refused  atomic.Int64
}

// call holds the account for d, or refuses at once when the account is full.
func (p *provider) call(ctx context.Context, d time.Duration) bool {
	n := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	for {
		pk := p.peak.Load()
		if n <= pk || p.peak.CompareAndSwap(pk, n) {
			break
		}
	}
	if n > p.limit {
		p.refused.Add(1)
		return false
	}
	select {
	case <-time.After(d): // the streamed turn
	case <-ctx.Done():
	}
	return true
}

type request struct {
	interactive bool
	model       string
	start       time.Duration // offset from the run's start
	turn        time.Duration // how long the provider streams
}

type result struct {
	name                string
	requests, completed int
	refused, peak       int64
	p50, p95, wall      time.Duration
}

// admit returns a function that takes (and later frees) whatever the run
// needs before calling the provider.
type admitFunc func(ctx context.Context, r request) (release func(), err error)

func run1(name string, reqs []request, limit int64, admit admitFunc) result {
	p := &provider{limit: limit}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		completed int
		wg        sync.WaitGroup
	)
	start := time.Now()
	for _, r := range reqs {
		wg.Go(func() {
			time.Sleep(r.start)
			began := time.Now()
			ok := false
			// A client retries a 429 after a short back-off, as SDKs do.
			for attempt := 0; attempt < 3 && !ok; attempt++ {
				release, err := admit(context.Background(), r)
				if err != nil {
					break
				}
				ok = p.call(context.Background(), r.turn)
				release()
				if !ok {
					time.Sleep(50 * time.Millisecond)
				}
			}
			took := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				completed++
			}
			if r.interactive {
				latencies = append(latencies, took)
			}
		})
	}
	wg.Wait()
	slices.Sort(latencies)
	return result{
		name: name, requests: len(reqs), completed: completed,
		refused: p.refused.Load(), peak: p.peak.Load(),
		p50: percentile(latencies, 50), p95: percentile(latencies, 95),
		wall: time.Since(start),
	}
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)-1)*p/100]
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

// outcome is what the demo measured, for its test.
type outcome struct{ direct, capped result }

var lastOutcome outcome

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		batch        = fs.Int("batch", 40, "long batch turns on the heavy model")
		interactive  = fs.Int("interactive", 40, "short interactive turns on the light model")
		accountLimit = fs.Int("account-limit", 5, "requests the provider allows in flight per account")
		modelCap     = fs.Int("model-cap", 3, "cap on the heavy model within the provider cap")
		seed         = fs.Uint64("seed", 1, "workload seed")
	)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *batch < 0 || *interactive < 0 || *accountLimit < 1 || *modelCap < 1 {
		return usageError{errors.New("-batch and -interactive must be >= 0, -account-limit and -model-cap >= 1")}
	}

	rng := rand.New(rand.NewPCG(*seed, 0))
	var reqs []request
	for range *batch {
		reqs = append(reqs, request{model: "glm-5", start: jitter(rng, 400), turn: 300*time.Millisecond + jitter(rng, 500)})
	}
	for range *interactive {
		reqs = append(reqs, request{interactive: true, model: "glm-4-air", start: jitter(rng, 1500), turn: 40*time.Millisecond + jitter(rng, 80)})
	}

	fmt.Fprintf(stdout, "provider allows %d in flight per account; %d batch turns (300-800 ms) and %d interactive turns (40-120 ms)\n\n",
		*accountLimit, *batch, *interactive)

	direct := run1("direct", reqs, int64(*accountLimit), func(context.Context, request) (func(), error) {
		return func() {}, nil
	})

	reg := registry.New[string](slots.Unlimited)
	reg.SetLimit("provider", *accountLimit)
	reg.SetLimit("provider/glm-5", min(*modelCap, *accountLimit))
	capped := run1("through inflight", reqs, int64(*accountLimit), func(ctx context.Context, r request) (func(), error) {
		s, err := reg.AcquireAll(ctx, "provider", "provider/"+r.model)
		if err != nil {
			return nil, err
		}
		return func() { s.Release() }, nil
	})
	lastOutcome = outcome{direct, capped}

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\trequests\tcompleted\tupstream 429s\tpeak in flight\tinteractive p50\tinteractive p95\twall time\t")
	for _, r := range []result{direct, capped} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%v\t%v\t%v\t\n", r.name, r.requests, r.completed, r.refused, r.peak,
			r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.wall.Round(10*time.Millisecond))
	}
	tw.Flush()
	if n := reg.Keys(); n != 0 {
		return fmt.Errorf("%d keys still held after the run", n)
	}
	if capped.refused != 0 || capped.completed != capped.requests {
		return errors.New("the capped run should see no 429s and complete every request")
	}
	return nil
}

func jitter(rng *rand.Rand, ms int) time.Duration {
	return time.Duration(rng.IntN(ms)) * time.Millisecond
}
