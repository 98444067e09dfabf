// Command gateway is an OpenAI-compatible reverse proxy that caps requests in
// flight per organisation and model (answered at once with a 429 when over)
// and per provider, model and API key with start pacing (waited for), and
// holds every slot of a streamed answer until the upstream body closes.
//
//	go run ./examples/gateway -config gateway.json [-listen ADDR] [-upstream URL]
//
// The configuration file:
//
//	{"listen": "127.0.0.1:8080", "upstream": "http://127.0.0.1:9000",
//	 "orgs": {"default_limit": 64, "limits": {"org-a": 4}},
//	 "provider": {"max_concurrent_requests": 5, "requests_per_minute": 40,
//	              "models": {"glm-5.3": {"max_concurrent_requests": 2}}},
//	 "cut_linger_ms": 250}
//
// cut_linger_ms (default 250, negative for none) keeps the provider's slots
// of a stream the client cut for that long after the upstream connection is
// closed, while the upstream may still count it.
//
// Endpoints: POST /v1/chat/completions, /v1/completions, /v1/embeddings;
// GET /v1/models (no slot); PATCH /admin/orgs/{org}/concurrent-limit with
// {"limit": N}; GET /debug/slots; GET /metrics.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/inflight-go/inflight/examples/internal/gateway"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run starts the gateway and returns the process's exit code: 2 for bad
// flags or configuration.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "configuration file (JSON)")
	listen := fs.String("listen", "", "address to listen on (overrides the file)")
	upstream := fs.String("upstream", "", "upstream base URL (overrides the file)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" {
		fmt.Fprintln(stderr, "gateway: -config is required")
		return 2
	}
	data, err := os.ReadFile(*configPath)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	cfg, err := gateway.ParseConfig(patchConfig(data, *listen, *upstream))
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	gw, err := gateway.New(cfg, http.DefaultTransport)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	defer gw.Close()
	srv := &http.Server{Addr: cfg.Listen, Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	slog.Info("gateway: listening", slog.String("addr", cfg.Listen), slog.String("upstream", cfg.Upstream))
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "gateway:", err)
		return 1
	}
	return 0
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
