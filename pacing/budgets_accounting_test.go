package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// budgetRes is a FleetReservation over a standalone Budget's Reservation,
// recording what the Transport asked of it.
type budgetRes struct {
	r     *pacing.Reservation
	mu    sync.Mutex
	calls []string
}

func (b *budgetRes) add(s string) { b.mu.Lock(); b.calls = append(b.calls, s); b.mu.Unlock() }
func (b *budgetRes) Start(context.Context) error {
	b.add("start")
	return b.r.Start()
}
func (b *budgetRes) Settle(_ context.Context, used pacing.Tokens) error {
	b.add(fmt.Sprintf("settle %d", used.Total()))
	b.r.Settle(used)
	return nil
}
func (b *budgetRes) Cancel(context.Context) error { b.add("cancel"); b.r.Cancel(); return nil }

// leftOf returns the Left of each budget of st, by "model/key/cap".
func leftOf(st []pacing.BudgetStatus) map[string]int {
	m := map[string]int{}
	for _, b := range st {
		m[b.Model+"/"+b.Key+"/"+b.Cap] = b.Left
	}
	return m
}

// Many concurrent requests through a real server, of every kind of answer
// and ending, each charging the Gate's budgets, a tenant's kept here
// (WithBudgets), a budget kept outside (WithFleetBudgets over a
// standalone Budget) and a Trace: what each
// budget counts at the end is what the requests' endings say, counted
// here independently.
func TestStressAccounting(t *testing.T) {
	const kinds = 13
	release := make(chan struct{}) // the streams that wait for the client to go
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		k, _ := strconv.Atoi(r.URL.Query().Get("k"))
		in, out := 3+k, 5+k
		usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d}`, in, out)
		fl := w.(http.Flusher)
		switch k {
		case 0, 1:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[{"message":{"content":"hi"}}],"usage":%s}`, usage)
		case 2:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			fl.Flush()
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
		case 3: // cut before its usage
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			fl.Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case 4, 5:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(429)
			fmt.Fprint(w, `{"error":{"message":"too many requests open"}}`)
		case 6:
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(429)
		case 7:
			w.Header().Set("Retry-After-Ms", "1")
			w.WriteHeader(503)
			fmt.Fprint(w, "busy")
		case 8:
			w.Header().Set("Retry-After-Ms", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(529)
			fmt.Fprint(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
		case 9:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":{"message":"bad"}}`)
		case 10:
			w.Header().Set("Location", "/elsewhere")
			w.WriteHeader(307)
		case 11:
			w.WriteHeader(500)
			fmt.Fprint(w, "oops")
		case 12: // its usage, then the client goes
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":%s}\n\n", usage)
			fl.Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}
	}))
	defer srv.Close()
	defer close(release)
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	defer base.CloseIdleConnections()

	const big = 10_000_000
	limits := pacing.BudgetLimits{TokensPerMinute: big, InputTokensPerMinute: big, OutputTokensPerMinute: big, MaxRequestsPerMinute: big}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 6, BudgetLimits: limits, MaxQueue: 1000, MaxQueueWaitMS: 60_000,
		Models:  map[string]pacing.ModelConfig{"m": {BudgetLimits: limits}},
		APIKeys: []pacing.KeyConfig{{ID: "k1", BudgetLimits: limits}, {ID: "k2", BudgetLimits: limits}}})
	own, err := pacing.NewBudget(limits)
	require.NoError(t, err)
	var resMu sync.Mutex
	var all []*budgetRes
	tenants := pacing.NewBudgets(func(string) *pacing.BudgetLimits { return &limits })
	rt := pacing.NewTransport(base, gate, pacing.WithCutLinger(0), pacing.WithStreamUsage(), pacing.WithBudgets(func(_ context.Context, _ string, cost pacing.Tokens) (*pacing.Reservation, error) {
		return tenants.Reserve("t", cost)
	}), pacing.WithFleetBudgets(func(_ context.Context, _ string, cost pacing.Tokens) (pacing.FleetReservation, error) {
		r, err := own.Reserve(cost)
		if err != nil {
			return nil, err
		}
		b := &budgetRes{r: r}
		resMu.Lock()
		all = append(all, b)
		resMu.Unlock()
		return b, nil
	}))

	type want struct{ tokens, reqs int }
	var mu sync.Mutex
	var total want
	traceTotal := want{}
	var wg sync.WaitGroup
	const n = 26 * 4
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := i % kinds
			est := pacing.Tokens{Input: 100 + i, Output: 200}
			in, out := 3+k, 5+k
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var st []pacing.Settlement
			var stMu sync.Mutex
			ctx = pacing.WithTrace(pacing.WithTokens(ctx, est), &pacing.Trace{Settled: func(s pacing.Settlement) { stMu.Lock(); st = append(st, s); stMu.Unlock() }})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions?k="+strconv.Itoa(k), strings.NewReader(`{"model":"m","stream":true}`))
			if err != nil {
				panic(err)
			}
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Errorf("request %d (kind %d): %v", i, k, err)
				return
			}
			var w want
			switch k {
			case 0, 2:
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				w = want{in + out, 1}
			case 1:
				resp.Body.Close()
				w = want{est.Total(), 1}
			case 3:
				buf := make([]byte, 8)
				_, _ = io.ReadFull(resp.Body, buf)
				cancel()
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				w = want{est.Total(), 1}
			case 4, 7, 8:
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			case 5, 6:
				resp.Body.Close()
			case 9, 10:
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				w = want{0, 1}
			case 11:
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				w = want{est.Total(), 1}
			case 12:
				// read through the usage chunk (the client does not get it: read a little), then go
				buf := make([]byte, 16)
				_, _ = io.ReadFull(resp.Body, buf)
				resp.Body.Close()
				w = want{in + out, 1}
			}
			stMu.Lock()
			tw := want{}
			switch {
			case len(st) == 0:
				tw = want{est.Total(), 1}
			case len(st) > 1:
				t.Errorf("request %d kind %d: settled %d times", i, k, len(st))
			case st[0].Served:
				tw = want{st[0].Used.Total(), 1}
			}
			stMu.Unlock()
			mu.Lock()
			total.tokens += w.tokens
			total.reqs += w.reqs
			traceTotal.tokens += tw.tokens
			traceTotal.reqs += tw.reqs
			mu.Unlock()
			if tw != w && k != 12 {
				t.Errorf("request %d kind %d: the Trace says %+v, want %+v", i, k, tw, w)
			}
		}()
	}
	wg.Wait()
	// kind 12: its usage came, but the client closed before reading it
	// through: counted as the Trace says
	gl := leftOf(gate.Budgets())
	t.Logf("gate: %v", gl)
	t.Logf("want %+v, trace %+v", total, traceTotal)
	assert.Equal(t, big-traceTotal.tokens, gl["//tokens_per_minute"], "the Gate's tokens")
	assert.Equal(t, big-traceTotal.reqs, gl["//max_requests_per_minute"], "the Gate's requests")
	assert.Equal(t, big-traceTotal.tokens, gl["m//tokens_per_minute"], "the model's tokens")
	assert.Equal(t, 2*big-traceTotal.tokens, gl["/k1/tokens_per_minute"]+gl["/k2/tokens_per_minute"], "the keys' tokens")
	assert.Equal(t, 2*big-traceTotal.reqs, gl["/k1/max_requests_per_minute"]+gl["/k2/max_requests_per_minute"], "the keys' requests")
	ol := leftOf(own.Status())
	assert.Equal(t, big-traceTotal.tokens, ol["//tokens_per_minute"], "the standalone budget's tokens")
	assert.Equal(t, big-traceTotal.reqs, ol["//max_requests_per_minute"], "the standalone budget's requests")
	tl := leftOf(tenants.Status("t"))
	assert.Equal(t, big-traceTotal.tokens, tl["//tokens_per_minute"], "the tenant's tokens (WithBudgets)")
	assert.Equal(t, big-traceTotal.reqs, tl["//max_requests_per_minute"], "the tenant's requests (WithBudgets)")
	assert.Zero(t, gate.Status().InFlight)
	_ = errors.New
}
