package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/inflight-go/inflight/examples/internal/gateway"
	"github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/pacing"
)

// maxCache bounds -tokens: the large prompts are 40% of it.
const maxCache = 1_000_000

// minCache bounds -tokens from below: a large request weighs 40% of the
// cache and about 105 tokens more, a small one about 155. Under a few
// hundred tokens they do not fit, and the gateway turns every one away as
// heavier than its cap; from 1,000, two large prompts overflow the cache,
// which is what the run shows.
const minCache = 1000

// runTokens is the token run: a self-hosted server that holds cache
// tokens in flight (its KV cache: each request holds its prompt and its
// max_tokens) and answers 429 past them, sent 6 prompts of 40% of its
// cache among 60 small ones, straight and through the gateway with the
// same max_inflight_tokens; with a store, through three gateways that
// share that cap on it too. Durations go through d.
func runTokens(stdout io.Writer, cache int, d func(int) time.Duration, rng *rand.Rand, store *fleetStore, progress *progress, out *outcome) error {
	prov := upstream.New(1000) // its requests are not what binds
	if err := prov.SetTokenLimit(int64(cache)); err != nil {
		return err
	}
	provURL, stop, err := serve(prov)
	if err != nil {
		return err
	}
	defer stop()
	// "hello world " is two tokens; a message adds 4.
	large := strings.Repeat("hello world ", cache*4/10/2)
	small := strings.Repeat("hello world ", 25)
	const answer = 100
	var reqs []request
	for i := range 66 {
		r := request{interactive: true, org: "chat", model: "glm-5", start: d(rng.IntN(1000)), turn: d(60 + rng.IntN(60)), prompt: small, maxTokens: answer}
		if i%11 == 0 {
			r.interactive, r.org, r.turn, r.prompt = false, "long-context", d(500+rng.IntN(300)), large
		}
		reqs = append(reqs, r)
	}
	fmt.Fprintf(stdout, "\na self-hosted server that holds %d tokens in flight (its cache: each request holds its\n"+
		"prompt and its max_tokens) and answers 429 past them; 6 prompts of about %d tokens among\n"+
		"60 small ones (about %d tokens), each with max_tokens %d\n\n"+
		"  direct               every request goes straight to the server, retrying a 429 twice\n"+
		"  through the gateway  max_inflight_tokens %d: each request weighs its prompt (counted with\n"+
		"                       o200k_base) and its max_tokens, and waits until its tokens fit\n",
		cache, cache*4/10, 50, answer, cache) // "hello world " 25 times, as the large prompt is 40% of the cache
	if store != nil {
		fmt.Fprintf(stdout, "  three gateways       spread over three gateways that share max_inflight_tokens %d on\n"+
			"                       %s: each request is a lease that weighs its tokens\n", cache, store.server)
	}
	fmt.Fprintln(stdout)
	tokenState := func(name string, total int, done *atomic.Int64) func() {
		return progress.startWith(name, total, done, func() string {
			c := prov.Counts()
			return fmt.Sprintf("%6d tokens held by the server now, %3d 429s so far", c.Tokens, c.Refused)
		})
	}
	out.tokensDirect = runTokenWorkload("direct", provURL, prov, reqs, tokenState)
	res, err := runGateway(gateway.Config{Upstream: provURL, Orgs: gateway.OrgsConfig{DefaultLimit: len(reqs)},
		Tokens:   &gateway.TokensConfig{ExpectedOutput: answer},
		Provider: pacing.Config{MaxInflightTokens: cache, MaxQueue: len(reqs)}},
		func(gwURL string) result {
			return runTokenWorkload("through the gateway", gwURL, prov, reqs, tokenState)
		})
	if err != nil {
		return err
	}
	out.tokensCapped = res
	runs := []result{out.tokensDirect, out.tokensCapped}
	if store != nil {
		name := "three gateways"
		cfg := gateway.Config{Upstream: provURL, Orgs: gateway.OrgsConfig{DefaultLimit: len(reqs)},
			Tokens:   &gateway.TokensConfig{ExpectedOutput: answer},
			Provider: pacing.Config{MaxInflightTokens: cache, MaxQueue: len(reqs)}, Fleet: store.shared}
		if out.tokensFleet, err = runGateways(3, cfg, func(urls []string) result {
			return runWith(name, urls, prov, reqs, false, func(total int, done *atomic.Int64) func() { return tokenState(name, total, done) })
		}); err != nil {
			return err
		}
		runs = append(runs, out.tokensFleet)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\trequests\tcompleted\tupstream 429s\tpeak tokens held\tsmall p50\tsmall p95\tlarge p95\twall time\t")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d of %d\t%v\t%v\t%v\t%v\t\n", r.name, r.requests, r.completed, r.refused, r.tokenPeak, cache,
			r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.batchP95.Round(time.Millisecond), r.wall.Round(10*time.Millisecond))
	}
	tw.Flush()
	fmt.Fprint(stdout, `
  peak tokens held    the most tokens the server was asked to hold at once, refused requests included
  small p50, p95      latencies of the completed small requests, from the first attempt to the end
  large p95           the same for the large prompts; the other columns as in the first table
`)
	return nil
}

// runTokenWorkload is runWorkload with the token run's progress line.
func runTokenWorkload(name, baseURL string, p *upstream.Provider, reqs []request, state func(string, int, *atomic.Int64) func()) result {
	return runWith(name, []string{baseURL}, p, reqs, false, func(total int, done *atomic.Int64) func() { return state(name, total, done) })
}
