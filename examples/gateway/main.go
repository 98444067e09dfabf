// Command gateway is an OpenAI-compatible reverse proxy that caps requests in
// flight per organisation and model (answered at once with a 429 when over)
// and per provider, model and API key with start pacing (waited for), and
// holds every slot of a streamed answer until the upstream body closes.
//
//	go run ./examples/gateway -config gateway.json [-listen ADDR] [-upstream URL] [-log-level debug]
//
// The configuration file:
//
//	{"listen": "127.0.0.1:8080", "upstream": "http://127.0.0.1:9000",
//	 "orgs": {"default_limit": 64, "limits": {"org-a": 4}},
//	 "provider": {"max_concurrent_requests": 5, "requests_per_minute": 40,
//	              "api_keys": [{"id": "k1", "max_concurrent_requests": 3}],
//	              "models": {"glm-5.3": {"max_concurrent_requests": 2}}},
//	 "api_key_env": {"k1": "PROVIDER_KEY_1"},
//	 "admin": {"token_env": "GATEWAY_ADMIN_TOKEN"},
//	 "shutdown_timeout_ms": 30000, "cut_linger_ms": 250}
//
// On SIGTERM or SIGINT the gateway stops accepting connections and lets the
// requests and streams in flight finish, and the slots of streams cut
// meanwhile linger out, for up to shutdown_timeout_ms (default 30 s); then
// it logs what it drained and exits 0. Requests still waiting for the
// provider are answered 503 at once. A second signal, or the timeout, cuts
// what is left and exits 1, once the cut requests have released their
// slots (for 2 s at most).
//
// An API key's id is a name; its secret is read from the environment
// variable api_key_env names for it, and never logged or exported.
//
// Endpoints: POST /v1/chat/completions, /v1/completions, /v1/embeddings;
// GET /v1/models (no slot); GET /metrics. With an admin section, behind
// "Authorization: Bearer <token>": PATCH and DELETE
// /admin/orgs/{org}/concurrent-limit, GET /debug/slots, GET /debug/provider
// (on admin.listen when set).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/examples/internal/gateway"
)

func main() {
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	os.Exit(run(os.Args[1:], os.Stderr, signals))
}

// run starts the gateway, serves until the first of signals, drains, and
// returns the process's exit code: 0 after a full drain, 1 when it was cut
// short or the gateway could not start, 2 for bad flags or configuration.
func run(args []string, stderr io.Writer, signals <-chan os.Signal) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "configuration file (JSON)")
	listen := fs.String("listen", "", "address to listen on (overrides the file)")
	upstream := fs.String("upstream", "", "upstream base URL (overrides the file)")
	level := fs.String("log-level", "info", "debug, info (one line per request), warn or error")
	format := fs.String("log-format", "text", "text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	log, err := newLogger(stderr, *level, *format)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	redis.SetLogger(&redisLogger{log: log, every: 5 * time.Second})
	if *configPath == "" {
		log.Error("gateway: -config is required")
		return 2
	}
	data, err := os.ReadFile(*configPath)
	if err != nil {
		log.Error("gateway: cannot read the configuration", slog.Any("error", err))
		return 2
	}
	cfg, err := gateway.ParseConfig(patchConfig(data, *listen, *upstream))
	if err != nil {
		log.Error("gateway: bad configuration", slog.Any("error", err))
		return 2
	}
	gw, err := gateway.New(cfg, http.DefaultTransport, gateway.WithLogger(log))
	if err != nil {
		// The configuration has been checked: what fails here is the
		// world (the fleet's store), which a later start may find up.
		log.Error("gateway: cannot start", slog.Any("error", err))
		return 1
	}
	defer gw.Close()

	errorLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	servers := []*http.Server{{Handler: gw, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errorLog}}
	addrs := []string{cfg.Listen}
	if h := gw.AdminHandler(); h != nil {
		servers = append(servers, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errorLog})
		addrs = append(addrs, cfg.Admin.Listen)
	}
	var listeners []net.Listener
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			log.Error("gateway: cannot listen", slog.String("addr", a), slog.Any("error", err))
			for _, l := range listeners {
				l.Close()
			}
			return 1
		}
		listeners = append(listeners, ln)
	}
	shown, _ := json.Marshal(cfg.Redacted())
	attrs := []any{slog.String("addr", listeners[0].Addr().String()), slog.String("upstream", cfg.Redacted().Upstream)}
	if len(listeners) > 1 {
		attrs = append(attrs, slog.String("admin_addr", listeners[1].Addr().String()))
	}
	log.Info("gateway: listening", append(attrs, slog.String("config", string(shown)))...)
	if cfg.Fleet != nil {
		checkStore(log, gw, cfg.Fleet)
	}

	served := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { served <- srv.Serve(listeners[i]) }()
	}
	var sig os.Signal
	select {
	case err := <-served:
		log.Error("gateway: serving failed", slog.Any("error", err))
		return 1
	case sig = <-signals:
	}
	return drain(log, gw, servers, sig, cfg.ShutdownTimeout(), signals)
}

// drain stops accepting, turns away the requests still waiting for the
// provider, waits for the requests in flight until timeout or a second
// signal, and returns the exit code.
func drain(log *slog.Logger, gw *gateway.Gateway, servers []*http.Server, sig os.Signal, timeout time.Duration, signals <-chan os.Signal) int {
	inFlight := gw.Active()
	gw.Drain()
	// Logged once every Shutdown has closed its listeners, so that a reader
	// of the line knows no new connection gets in.
	var closed sync.WaitGroup
	for _, srv := range servers {
		closed.Add(1)
		srv.RegisterOnShutdown(closed.Done)
	}
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		closed.Wait()
		log.Info("gateway: draining", slog.String("signal", sig.String()), slog.Int("in_flight", inFlight),
			slog.Duration("timeout", timeout))
	}()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case s := <-signals:
			log.Warn("gateway: second signal, exiting now", slog.String("signal", s.String()))
			cancel()
		case <-ctx.Done():
		}
	}()
	// All at once: a server shut down after another would accept
	// connections for as long as the first one drains.
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, srv := range servers {
		wg.Go(func() { errs[i] = srv.Shutdown(ctx) })
	}
	wg.Wait()
	<-logged
	if err := errors.Join(errs...); err != nil {
		cut := gw.Active()
		for _, srv := range servers {
			srv.Close()
		}
		// Close has cut the connections, not waited for their handlers:
		// let them release their slots (and the fleet's leases) before the
		// gateway closes, for a moment at most.
		idleCtx, cancelIdle := context.WithTimeout(context.Background(), cutUnwindTimeout)
		idle := gw.WaitIdle(idleCtx)
		cancelIdle()
		log.Warn("gateway: drain cut short", slog.Int("drained", max(inFlight-cut, 0)), slog.Int("cut", cut),
			slog.Duration("took", time.Since(start)), slog.Bool("released", idle), slog.Any("error", err))
		return 1
	}
	// A stream cut by its client keeps its provider slots for
	// cut_linger_ms after its handler has returned: let them go before
	// the gateway closes, within the drain's bound, so that no fleet lease
	// is left in the store, holding a slot for nobody until it expires.
	if !gw.WaitIdle(ctx) {
		log.Warn("gateway: drain cut short", slog.Int("drained", inFlight), slog.Int("cut", 0),
			slog.Duration("took", time.Since(start)), slog.Bool("released", false), slog.Any("error", ctx.Err()))
		return 1
	}
	log.Info("gateway: drained", slog.Int("requests", inFlight), slog.Duration("took", time.Since(start)),
		slog.Int("tenant_keys_held", gw.TenantKeys()), slog.Int("provider_in_flight", gw.Provider().InFlight))
	return 0
}

// cutUnwindTimeout bounds the wait, after a drain was cut short, for the
// cut requests to release what they hold: a cut stream's handler returns
// at once, its provider slot after cut_linger_ms (250 ms by default).
const cutUnwindTimeout = 2 * time.Second

// checkStore pings the fleet's Redis or PostgreSQL (and its listening
// connection's database) once at startup, so that an unreachable one is
// named before the first request meets it.
func checkStore(log *slog.Logger, gw *gateway.Gateway, f *gateway.FleetConfig) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	store := "redis"
	if f.PostgresURL != "" {
		store = "postgres"
	}
	if err := gw.Ping(ctx); err != nil {
		mode := f.OnUnavailable
		if mode == "" {
			mode = "local"
		}
		log.Warn("gateway: "+store+" is unreachable at startup; until it answers, the fleet caps follow on_unavailable",
			slog.String("on_unavailable", mode), slog.Any("error", err))
		return
	}
	log.Info("gateway: " + store + " answers")
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level: %q is not debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format: %q is not text or json", format)
}

// redisLogger routes go-redis's own messages (dial failures, pool
// trouble) to slog, one line per interval at most: an unreachable Redis
// makes one per connection attempt.
type redisLogger struct {
	log   *slog.Logger
	every time.Duration

	mu         sync.Mutex // protects the fields below
	last       time.Time
	suppressed int
}

func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	l.log.WarnContext(ctx, "gateway: redis client", slog.String("detail", msg), slog.Int("suppressed_since_last", suppressed))
}

// patchConfig applies the flag overrides to the file's JSON.
func patchConfig(data []byte, listen, upstream string) []byte {
	if listen == "" && upstream == "" {
		return data
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return data // ParseConfig reports it
	}
	if listen != "" {
		m["listen"] = listen
	}
	if upstream != "" {
		m["upstream"] = upstream
	}
	out, err := json.Marshal(m)
	if err != nil {
		return data
	}
	return out
}
