package readme

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/slots"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestREADMECodeIsThisPackage keeps the README's Go code compiling: each
// Go block of README.md is a part of readme.go, verbatim, and each function
// of readme.go is shown in the README.
func TestREADMECodeIsThisPackage(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("readme.go")
	require.NoError(t, err)
	blocks := goBlock.FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, blocks, "the README shows Go code")
	all := ""
	for _, b := range blocks {
		assert.Contains(t, string(src), b[1], "a Go block of README.md that readme.go does not have: edit readme.go, then copy it")
		all += b[1]
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "readme.go", src, parser.ParseComments)
	require.NoError(t, err)
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok {
			text := string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
			assert.Contains(t, all, text, "readme.go's %s is not in README.md", fn.Name.Name)
		}
	}
}

// sseUpstream streams one event, then waits for release or the client's
// end before the last one.
func sseUpstream(t *testing.T) (*httptest.Server, chan struct{}) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
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
	client := newTestClient(t)

	var held []*http.Response
	for range 2 {
		held = append(held, openStream(t, client, gw.URL, "glm-5"))
	}
	require.Equal(t, 2, reg.InFlight("model:glm-5"))

	t.Run("over the model cap: a 429 with Retry-After once the wait is over", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, gw.URL, strings.NewReader(`{}`))
		req.Header.Set("X-Model", "glm-5")
		resp, err := client.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		assert.Equal(t, "too many requests in flight: 2 of 2, 0 queued (timed out waiting)\n", string(body))
	})
	t.Run("another model still gets through, within the provider cap", func(t *testing.T) {
		resp := openStream(t, client, gw.URL, "glm-4-air")
		resp.Body.Close()
	})
	close(release)
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
	client, lim := NewCappedClient()
	defer client.CloseIdleConnections()
	resp, err := client.Get(up.URL)
	require.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, 1, lim.InFlight(), "the stream holds its slot after RoundTrip has returned")
	close(release)
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
