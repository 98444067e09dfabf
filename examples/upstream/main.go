// Command upstream runs the simulated model provider that the demo uses, so
// that the example gateway has something to proxy to: it streams chat
// completions as server-sent events (a token every 20 ms, for "turn_ms" of
// the request's JSON body, 1000 by default) and answers 429 (code 1302) past
// -limit requests in flight. While it runs, it prints a line of its counts
// each -every (1 s by default) in which they changed: the requests open
// now against its limit, and since the start those served, those refused
// and the most open at once (refused ones included: the burst the account
// saw).
//
//	go run ./examples/upstream -listen 127.0.0.1:9000 -limit 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/inflight-go/inflight/examples/internal/upstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9000", "address to listen on")
	limit := fs.Int("limit", 5, "requests in flight allowed before 429s")
	tokens := fs.Int64("tokens", 0, "tokens in flight allowed before 429s, each request holding its prompt's and its max_tokens (0: not counted)")
	every := fs.Duration("every", time.Second, "how often to print the counts when they changed (0: never)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *limit < 1 {
		fmt.Fprintln(stderr, "upstream: -limit must be at least 1")
		return 2
	}
	if *every < 0 {
		fmt.Fprintln(stderr, "upstream: -every must not be negative")
		return 2
	}
	if *tokens < 0 {
		fmt.Fprintln(stderr, "upstream: -tokens must not be negative")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("upstream: cannot listen", slog.Any("error", err))
		return 1
	}
	p := upstream.New(*limit)
	if err := p.SetTokenLimit(*tokens); err != nil {
		log.Error("upstream: cannot count tokens", slog.Any("error", err))
		return 1
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	log.Info("upstream: listening", slog.String("addr", ln.Addr().String()), slog.Int("limit", *limit), slog.Int64("token_limit", *tokens))
	if *every > 0 {
		go report(ctx, p, *limit, *every, stderr)
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		log.Error("upstream: serving failed", slog.Any("error", err))
		return 1
	}
	c := p.Counts()
	log.Info("upstream: stopped", slog.Int64("served", c.Served), slog.Int64("refused", c.Refused), slog.Int64("peak_in_flight", c.Peak),
		slog.Int64("peak_tokens", c.TokenPeak))
	return 0
}

// report prints p's counts each every in which they changed, until ctx
// ends.
func report(ctx context.Context, p *upstream.Provider, limit int, every time.Duration, w io.Writer) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last upstream.Counts
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if c := p.Counts(); c != last {
			fmt.Fprintf(w, "upstream: open %d of %d now; since the start %d served, %d refused (429), at most %d open at once\n",
				c.InFlight, limit, c.Served, c.Refused, c.Peak)
			last = c
		}
	}
}
