package readme

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inflight-go/inflight/examples/internal/gateway"
	"github.com/inflight-go/inflight/pacing/pacingtest"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fenced returns the bodies of the README's code blocks in lang.
func fenced(readme []byte, lang string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllSubmatch(readme, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

func readREADME(t *testing.T) []byte {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	return readme
}

// TestREADMECodeIsThisPackage keeps the README's Go code compiling: each
// Go block of README.md is whole declarations of readme.go, verbatim, and
// each top-level declaration of readme.go (with its doc comment) is shown
// in the README.
func TestREADMECodeIsThisPackage(t *testing.T) {
	src, err := os.ReadFile("readme.go")
	require.NoError(t, err)
	blocks := fenced(readREADME(t), "go")
	require.NotEmpty(t, blocks, "the README shows Go code")
	for i, b := range blocks {
		_, err := parser.ParseFile(token.NewFileSet(), "block.go", "package readme\n"+b, 0)
		assert.NoError(t, err, "Go block %d of README.md is not whole declarations", i+1)
		assert.Contains(t, string(src), b, "Go block %d of README.md is not in readme.go: edit readme.go, then copy it", i+1)
	}
	all := strings.Join(blocks, "\n")
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "readme.go", src, parser.ParseComments)
	require.NoError(t, err)
	text := func(from, to token.Pos) string {
		return string(src[fset.Position(from).Offset:fset.Position(to).Offset])
	}
	for _, d := range f.Decls {
		var name string
		from := d.Pos()
		switch d := d.(type) {
		case *ast.FuncDecl:
			name = d.Name.Name
			if d.Doc != nil {
				from = d.Doc.Pos()
			}
		case *ast.GenDecl:
			if d.Tok == token.IMPORT {
				continue
			}
			name = d.Tok.String() + " " + declNames(d)
			if d.Doc != nil {
				from = d.Doc.Pos()
			}
		}
		assert.Contains(t, all, text(from, d.End()), "readme.go's %s is not in README.md as it is", name)
	}
}

func declNames(d *ast.GenDecl) string {
	var names []string
	for _, s := range d.Specs {
		switch s := s.(type) {
		case *ast.TypeSpec:
			names = append(names, s.Name.Name)
		case *ast.ValueSpec:
			for _, n := range s.Names {
				names = append(names, n.Name)
			}
		}
	}
	return strings.Join(names, ", ")
}

// TestREADMEGatewayConfigParses reads the README's gateway.json with the
// gateway's own parser, which refuses unknown fields and bad values.
func TestREADMEGatewayConfigParses(t *testing.T) {
	readme := readREADME(t)
	blocks := fenced(readme, "json")
	require.Len(t, blocks, 1, "the README shows one gateway.json")
	// The environment is what the README's commands export, each variable
	// a secret such as they make: a config that names another variable
	// stops a gateway started as the README says.
	export := regexp.MustCompile(`(?m)^export ([A-Za-z_][A-Za-z0-9_]*)=`)
	for _, b := range fenced(readme, "sh") {
		for _, m := range export.FindAllStringSubmatch(b, -1) {
			t.Setenv(m[1], base64.StdEncoding.EncodeToString([]byte("twenty-four random bytes")))
		}
	}
	cfg, err := gateway.ParseConfig([]byte(blocks[0]))
	require.NoError(t, err)
	assert.NotEmpty(t, cfg.Upstream)
	shipped, err := os.ReadFile("../gateway/gateway.json")
	require.NoError(t, err)
	assert.Equal(t, string(shipped), blocks[0], "the README shows examples/gateway/gateway.json as it is")
	assert.Zero(t, cfg.Provider.RequestsPerMinute+int(cfg.Provider.MinIntervalMS), "a first run shows caps, not pacing")

	// The gateway's own page: its fuller configuration parses too, with
	// the key's variable set as an operator would.
	page, err := os.ReadFile("../gateway/README.md")
	require.NoError(t, err)
	fuller := fenced(page, "json")
	require.NotEmpty(t, fuller)
	t.Setenv("PROVIDER_KEY_1", "sk-from-the-environment")
	for i, b := range fuller {
		_, err := gateway.ParseConfig([]byte(b))
		assert.NoError(t, err, "json block %d of examples/gateway/README.md", i+1)
	}
}

// TestREADMEPathsExist: every ./examples/... path in the README's shell
// blocks is in the repository.
func TestREADMEPathsExist(t *testing.T) {
	path := regexp.MustCompile(`\./examples/[A-Za-z0-9_./-]*[A-Za-z0-9_]`)
	seen := 0
	for _, b := range fenced(readREADME(t), "sh") {
		for _, p := range path.FindAllString(b, -1) {
			seen++
			_, err := os.Stat(filepath.Join("../..", p))
			assert.NoError(t, err, "README.md runs %s, which is not in the repository", p)
		}
	}
	assert.NotZero(t, seen, "the README's commands name the examples")
}

// sseUpstream streams one event, then waits for release or the client's
// end before the last one. A test registers release as a cleanup after its
// servers' Close, so that a failure midway does not leave Close waiting
// for a stream that nothing ends.
func sseUpstream(t *testing.T) (*httptest.Server, func()) {
	ch := make(chan struct{})
	release := sync.OnceFunc(func() { close(ch) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	return up, release
}

func newTestClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// openStream sends a request for model and returns once its first event has
// come.
func openStream(t *testing.T, client *http.Client, u, model string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(`{"stream":true}`))
	require.NoError(t, err)
	req.Header.Set("X-Model", model)
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "data: first\n", line)
	return resp
}

func TestNewProxy(t *testing.T) {
	up, release := sseUpstream(t)
	target, err := url.Parse(up.URL)
	require.NoError(t, err)
	handler, reg := NewProxy(target, 50*time.Millisecond)
	gw := httptest.NewServer(handler)
	t.Cleanup(gw.Close)
	t.Cleanup(release)
	client := newTestClient(t)

	var held []*http.Response
	for range 2 {
		held = append(held, openStream(t, client, gw.URL, "glm-5"))
	}
	require.Equal(t, 2, reg.InFlight("model:glm-5"), "the two streams hold the model's slots")

	t.Run("over the model cap: a 429 with Retry-After once the wait is over", func(t *testing.T) {
		// Bounded, so that a request let in by mistake fails the test
		// instead of streaming until the upstream is released.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL, strings.NewReader(`{}`))
		req.Header.Set("X-Model", "glm-5")
		resp, err := client.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		assert.JSONEq(t, `{"error":{"type":"rate_limit_error","message":"too many requests in flight: 2 of 2, 0 queued (timed out waiting)"}}`, string(body))
	})
	t.Run("another model still gets through, within the provider cap", func(t *testing.T) {
		resp := openStream(t, client, gw.URL, "glm-4-air")
		resp.Body.Close()
	})
	release()
	for _, resp := range held {
		rest, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the stream ends whole")
		resp.Body.Close()
	}
	waitFor(t, func() bool { return reg.Keys() == 0 })

	t.Run("an upstream that is down: a 502", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		down, _ := url.Parse("http://" + ln.Addr().String())
		ln.Close()
		handler, reg := NewProxy(down, time.Second)
		gw := httptest.NewServer(handler)
		defer gw.Close()
		resp, err := client.Get(gw.URL)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		assert.Zero(t, reg.Keys(), "the failed exchange gave its slots back")
	})
}

func TestNewCappedClient(t *testing.T) {
	up, release := sseUpstream(t)
	t.Cleanup(release)
	client, lim := NewCappedClient()
	defer client.CloseIdleConnections()
	resp, err := client.Get(up.URL)
	require.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, 1, lim.InFlight(), "the stream holds its slot after RoundTrip has returned")
	release()
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 0, lim.InFlight())
}

func TestPrioritised(t *testing.T) {
	lim := NewSharedLimiter()
	var held []*slots.Slot
	for range 5 {
		s, err := lim.TryAcquire()
		require.NoError(t, err)
		held = append(held, s)
	}
	batch := make(chan *slots.Slot, 1)
	go func() {
		s, _ := lim.Acquire(slots.WithPriority(context.Background(), slots.PriorityBatch))
		batch <- s
	}()
	waitFor(t, func() bool { return lim.Waiting() == 1 })
	interactive := make(chan *slots.Slot, 1)
	go func() {
		s, _ := Prioritised(context.Background(), lim, "org-a")
		interactive <- s
	}()
	waitFor(t, func() bool { return lim.Waiting() == 2 })
	held[0].Release()
	s := <-batch // batch holds less than its minimum of 1: it goes first
	held[1].Release()
	i := <-interactive
	for _, h := range append(held[2:], s, i) {
		h.Release()
	}
	assert.Equal(t, 0, lim.InFlight())
}

func TestNewServer(t *testing.T) {
	inHandler, leave := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inHandler)
		<-leave
		io.WriteString(w, "done")
	})))
	t.Cleanup(srv.Close)
	client := newTestClient(t)
	var wg sync.WaitGroup
	wg.Go(func() {
		resp, err := client.Get(srv.URL + "/work")
		if assert.NoError(t, err) {
			resp.Body.Close()
		}
	})
	<-inHandler
	resp, err := client.Get(srv.URL + "/debug/slots")
	require.NoError(t, err)
	var holders struct {
		InUse int `json:"in_use"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&holders))
	resp.Body.Close()
	assert.Equal(t, 1, holders.InUse, "the handler at work holds a slot")
	close(leave)
	wg.Wait()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond)
}

// LimitProvider, added to a reverse proxy whose Transport is the simulated
// provider (which allows 2 requests at once on the account): twenty
// streaming requests for glm-5 at once are answered 200, or 429 as the
// provider refused the one that tested the model's cap; the provider never
// has more than the model's 3 at most; the model's cap is learned; every
// request goes with one of the pool's keys; nothing stays held.
func TestLimitProvider(t *testing.T) {
	provider := &pacingtest.Upstream{Schedule: []pacingtest.Step{{Cap: 2}}, HeaderDelay: 5 * time.Millisecond, RefusalDelay: 5 * time.Millisecond}
	provider.Start()
	var mu sync.Mutex
	auths := map[string]int{}
	existing := roundTrip(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		auths[r.Header.Get("Authorization")]++
		mu.Unlock()
		return provider.RoundTrip(r)
	})
	target, _ := url.Parse("https://api.provider.example")
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = existing
	gate, err := LimitProvider(proxy, map[string]string{"a": "sk-a", "b": "sk-b"})
	require.NoError(t, err)
	t.Cleanup(gate.Close)
	gw := httptest.NewServer(proxy)
	t.Cleanup(gw.Close)

	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
			req.Header.Set("Authorization", "Bearer the-clients-own")
			req.Header.Set(pacingtest.ServiceHeader, "100ms")
			resp, err := gw.Client().Do(req)
			if !assert.NoError(t, err) {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	byCode := map[int]int{}
	for c := range codes {
		byCode[c]++
	}
	c := provider.Counts()
	learned := gate.Learned().Models["glm-5"]
	t.Logf("answers by status %v; the provider: %d attempts, %d refused, at most %d at once; glm-5's learned cap %d; keys sent %v",
		byCode, c.Attempts, c.Refused, c.Peak, learned.Cap, auths)
	assert.Equal(t, 20, byCode[200]+byCode[429], "every request answered 200 or 429")
	assert.Equal(t, c.Refused, byCode[429], "a 429 is the provider's refusal, passed on")
	assert.LessOrEqual(t, c.Peak, 3, "never more than the model's most")
	// A start over the provider's 2 is refused, which cuts the learned cap
	// below 3. Where it lands depends on the order in which the requests'
	// ends and starts reach the provider on this machine (2 in seven runs
	// of the whole suite, 1 in one): its score is pacing's to assert, in
	// virtual time.
	assert.Positive(t, c.Refused, "the cap was tested")
	assert.LessOrEqual(t, learned.Cap, 2, "the model's cap learned below the refused start")
	assert.GreaterOrEqual(t, learned.Cap, 1)
	assert.Zero(t, auths["Bearer the-clients-own"], "the client's key never reaches the provider")
	assert.Equal(t, c.Attempts, auths["Bearer sk-a"]+auths["Bearer sk-b"], "every request with one of the pool's keys")
	assert.Zero(t, gate.Status().InFlight)
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNoLargeFiles: no file the repository tracks is over 1 MB (a build
// output committed by mistake, say; .gitignore names the examples'
// binaries).
func TestNoLargeFiles(t *testing.T) {
	out, err := exec.Command("git", "-C", "../..", "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout?)", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	require.NotEmpty(t, files)
	for _, f := range files {
		st, err := os.Stat(filepath.Join("../..", f))
		if err != nil {
			continue // deleted in the work tree
		}
		assert.LessOrEqual(t, st.Size(), int64(1<<20), "%s is over 1 MB", f)
	}
}

// FleetOnRedis and FleetOnPostgres, each in two processes on one real
// server: 64 holders at once across both, the 65th refused, and a release
// frees a place for the other process.
func TestFleetOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	var rs []*fleet.Registry[string]
	for range 2 {
		r := FleetOnRedis(srv.Client())
		t.Cleanup(r.Close)
		rs = append(rs, r)
	}
	sharedCap(t, rs)
}

func TestFleetOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	var rs []*fleet.Registry[string]
	for range 2 {
		pool, err := pgxpool.New(context.Background(), srv.URL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		r, err := FleetOnPostgres(context.Background(), pool)
		require.NoError(t, err)
		t.Cleanup(r.Close)
		rs = append(rs, r)
	}
	sharedCap(t, rs)
}

// sharedCap checks that two processes share the cap of 64 on "provider".
func sharedCap(t *testing.T, rs []*fleet.Registry[string]) {
	t.Helper()
	var held []*slots.Slot
	for i := range 64 {
		s, err := rs[i%2].TryAcquire("provider")
		require.NoError(t, err)
		held = append(held, s)
	}
	_, err := rs[0].TryAcquire("provider")
	require.ErrorIs(t, err, slots.ErrLimitReached)
	held[1].Release() // a holder of the second process
	require.Eventually(t, func() bool {
		s, err := rs[0].TryAcquire("provider")
		if err == nil {
			held[1] = s
		}
		return err == nil
	}, 5*time.Second, 5*time.Millisecond, "the freed place reaches the other process")
	for _, s := range held {
		s.Release()
	}
}

// NewObservedServer, with an SDK installed as the program would: a request
// has its wait for a slot as a child of its server span, and /metrics has
// the cap's series.
func TestNewObservedServer(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	})
	h, err := NewObservedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "done") }))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	client := newTestClient(t)
	resp, err := client.Get(srv.URL + "/work")
	require.NoError(t, err)
	resp.Body.Close()
	waitFor(t, func() bool { return len(spans.Ended()) == 2 })
	var server, wait sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "acquire server" {
			wait = s
		} else {
			server = s
		}
	}
	require.NotNil(t, wait, "the wait, a span of its own")
	assert.Equal(t, server.SpanContext().SpanID(), wait.Parent().SpanID(), "under the request's span")

	resp, err = client.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), `inflight_acquired_total{cap="server"} 1`)
}
