package pacing_test

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// Answers a base RoundTripper may give that the Transport must take
// without a panic and without holding anything: no response and no error
// (net/http's Client reports that as an error), and a response without a
// body, with and without the options that read the body.
func TestTransportOddAnswers(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func(context.Context) context.Context
		opts []pacing.TransportOption
	}{
		{"plain", func(ctx context.Context) context.Context { return ctx }, nil},
		{"WithTokens", func(ctx context.Context) context.Context {
			return pacing.WithTokens(ctx, pacing.Tokens{Input: 10, Output: 10})
		}, nil},
		{"WithRateLimitHeaders", func(ctx context.Context) context.Context { return ctx }, []pacing.TransportOption{pacing.WithRateLimitHeaders()}},
		{"WithStreamUsage", func(ctx context.Context) context.Context {
			return pacing.WithTokens(ctx, pacing.Tokens{Input: 10, Output: 10})
		}, []pacing.TransportOption{pacing.WithStreamUsage()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx(pacing.WithModelName(t.Context(), "m"))
			t.Run("no response, no error", func(t *testing.T) {
				base := roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil })
				gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
				// A failure that may have reached the upstream keeps its
				// slot for the cut linger: none here.
				opts := append([]pacing.TransportOption{pacing.WithCutLinger(0)}, tc.opts...)
				resp, err := pacing.NewTransport(base, gate, opts...).RoundTrip(post(t, ctx, `{"model":"m"}`))
				assert.Error(t, err)
				assert.Nil(t, resp)
				assert.Zero(t, gate.Status().InFlight)
				_, err = (&http.Client{Transport: pacing.NewTransport(base, gate, opts...)}).Do(post(t, ctx, `{"model":"m"}`))
				assert.Error(t, err)
				assert.Zero(t, gate.Status().InFlight)
			})
			for _, body := range []io.ReadCloser{nil, http.NoBody} {
				t.Run("no body", func(t *testing.T) {
					base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
						return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body, Request: r}, nil
					})
					gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
					resp, err := pacing.NewTransport(base, gate, tc.opts...).RoundTrip(post(t, ctx, `{"model":"m"}`))
					require.NoError(t, err)
					assert.Zero(t, gate.Status().InFlight, "an answer without a body is complete: its slot goes at once")
					if resp.Body != nil {
						_, err = io.Copy(io.Discard, resp.Body)
						assert.NoError(t, err)
						assert.NoError(t, resp.Body.Close())
					}
				})
			}
		})
	}
}

// An answer to a HEAD request (http.NoBody, through net/http) frees its
// slot at once, also under WithTokens, whose usage it cannot report.
func TestTransportHeadFreesAtOnce(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(up.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	rt := pacing.NewTransport(base, gate, pacing.WithModel(func(*http.Request) string { return "m" }))
	for _, weighed := range []bool{false, true} {
		ctx := context.Background()
		if weighed {
			ctx = pacing.WithTokens(ctx, pacing.Tokens{Input: 1, Output: 1})
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodHead, up.URL, nil)
		require.NoError(t, err)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		assert.Zero(t, gate.Status().InFlight, "weighed %v: freed before the body is closed", weighed)
		require.NoError(t, resp.Body.Close())
	}
}

// A Classifier that panics: the panic goes on to the caller, the slot is
// freed, and the answer's body is closed, so that its connection to the
// upstream does not stay open (with net/http's goroutines for it) under a
// context that never ends. The upstream sends more than MaxClassifyBody
// bytes and holds its answer open, as a stream does.
func TestTransportClassifierPanicClosesTheAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		use    func(*http.Response)
	}{
		{"200: the panic in RoundTrip", http.StatusOK, nil},
		{"429 closed unread: the panic in Close", http.StatusTooManyRequests, func(r *http.Response) { r.Body.Close() }},
		{"429 read: the panic in Read", http.StatusTooManyRequests, func(r *http.Response) {
			_, _ = io.ReadFull(r.Body, make([]byte, pacing.MaxClassifyBody)) // the verdict's bytes, and no more
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var open atomic.Int64
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, `{"error":{"type":"x"}}`+strings.Repeat(" ", 2*pacing.MaxClassifyBody))
				w.(http.Flusher).Flush()
				<-r.Context().Done() // open until the client lets the connection go
			}))
			up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				switch s {
				case http.StateNew:
					open.Add(1)
				case http.StateClosed, http.StateHijacked:
					open.Add(-1)
				}
			}
			up.Start()
			t.Cleanup(func() {
				up.CloseClientConnections() // left open by a failure
				up.Close()
			})
			ignore := goleak.IgnoreCurrent()
			base := &http.Transport{}
			gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
			panicky := func(int, http.Header, []byte) pacing.Verdict { panic("a classifier's bug") }
			rt := pacing.NewTransport(base, gate, pacing.WithClassifier(panicky))
			req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, up.URL, strings.NewReader(`{"model":"m"}`))
			require.NoError(t, err)
			var p any
			func() {
				defer func() { p = recover() }()
				resp, err := rt.RoundTrip(req)
				require.NoError(t, err)
				tc.use(resp)
			}()
			assert.Equal(t, "a classifier's bug", p, "the panic goes on")
			assert.Zero(t, gate.Status().InFlight, "the slot is freed")
			base.CloseIdleConnections()
			assert.Eventually(t, func() bool { return open.Load() == 0 }, 5*time.Second, 5*time.Millisecond,
				"the upstream's connection closed")
			assert.NoError(t, goleak.Find(ignore), "net/http's goroutines for the connection gone")
		})
	}
}

// gzipUpstream answers body with status, compressed when the request
// accepts gzip, as most API front ends do.
func gzipUpstream(t *testing.T, status int, body string) *url.URL {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(status)
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, body)
		_ = zw.Close()
	}))
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	require.NoError(t, err)
	return u
}

// Behind an httputil.ReverseProxy, which passes the client's
// Accept-Encoding on (Python's clients send gzip by default), the answer is
// read as the upstream's words all the same: a 429 for a quota is
// classified Quota, and a usage settles the request's budgets, whether
// the client accepts gzip or not.
func TestTransportReadsAnswersTheClientAcceptsCompressed(t *testing.T) {
	send := func(t *testing.T, h http.Handler, acceptEncoding string) int {
		gw := httptest.NewServer(h)
		t.Cleanup(gw.Close)
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		if acceptEncoding != "" {
			req.Header.Set("Accept-Encoding", acceptEncoding)
		}
		client := &http.Transport{DisableCompression: true} // as the client sent it, undecoded
		t.Cleanup(client.CloseIdleConnections)
		resp, err := client.RoundTrip(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	t.Run("quota", func(t *testing.T) {
		target := gzipUpstream(t, http.StatusTooManyRequests, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`)
		var mu sync.Mutex
		var kinds []pacing.Kind
		classify := func(status int, h http.Header, b []byte) pacing.Verdict {
			v := pacing.DefaultClassifier(status, h, b)
			mu.Lock()
			kinds = append(kinds, v.Kind)
			mu.Unlock()
			return v
		}
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 4})
		proxy := &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			Transport: pacing.NewTransport(base, gate, pacing.WithClassifier(classify)),
		}
		for _, ae := range []string{"", "gzip, deflate"} {
			assert.Equal(t, http.StatusTooManyRequests, send(t, proxy, ae))
		}
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []pacing.Kind{pacing.Quota, pacing.Quota}, kinds, "plain, then with gzip accepted")
	})
	t.Run("usage", func(t *testing.T) {
		target := gzipUpstream(t, http.StatusOK, `{"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}`)
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 4})
		var mu sync.Mutex
		var settled []pacing.Settlement
		tr := &pacing.Trace{Settled: func(s pacing.Settlement) { mu.Lock(); settled = append(settled, s); mu.Unlock() }}
		proxy := &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			Transport: pacing.NewTransport(base, gate),
		}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := pacing.WithTrace(pacing.WithTokens(r.Context(), pacing.Tokens{Input: 100, Output: 100}), tr)
			proxy.ServeHTTP(w, r.WithContext(ctx))
		})
		for _, ae := range []string{"", "gzip"} {
			assert.Equal(t, http.StatusOK, send(t, h, ae))
		}
		mu.Lock()
		defer mu.Unlock()
		want := pacing.Settlement{Served: true, Used: pacing.Tokens{Input: 7, Output: 5}}
		assert.Equal(t, []pacing.Settlement{want, want}, settled)
	})
}

// A request sent under slots.WithoutSlot is not admitted, and its Trace
// hears nothing of it, whatever the answer.
func TestTransportWithoutSlotIsNotSettled(t *testing.T) {
	for _, status := range []int{http.StatusOK, http.StatusBadRequest, http.StatusTooManyRequests} {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{"error":{}}`)), Request: r}, nil
		})
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
		var heard atomic.Int32
		tr := &pacing.Trace{
			Admitted: func(pacing.Admission) { heard.Add(1) },
			Settled:  func(pacing.Settlement) { heard.Add(1) },
		}
		ctx := pacing.WithTrace(slots.WithoutSlot(pacing.WithModelName(t.Context(), "m")), tr)
		resp, err := pacing.NewTransport(base, gate).RoundTrip(post(t, ctx, `{"model":"m"}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		assert.Zero(t, heard.Load(), "status %d", status)
	}
}

// A Trace hook that panics while the request is admitted or refused: the
// panic goes on, nothing is held, and the request's body is closed, as a
// RoundTripper that does not send must.
func TestTransportHookPanicClosesTheRequestBody(t *testing.T) {
	for _, name := range []string{"Admitted", "Refused"} {
		t.Run(name, func(t *testing.T) {
			base, _ := recording(t)
			gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
			ctx := pacing.WithModelName(context.Background(), "m")
			tr := &pacing.Trace{Admitted: func(pacing.Admission) { panic("a hook's bug") }}
			if name == "Refused" {
				c, cancel := context.WithCancel(ctx)
				cancel()
				ctx = c
				tr = &pacing.Trace{Refused: func(error) { panic("a hook's bug") }}
			}
			req, body := postCounting(t, pacing.WithTrace(ctx, tr), `{"model":"m"}`)
			var p any
			func() {
				defer func() { p = recover() }()
				_, _ = pacing.NewTransport(base, gate).RoundTrip(req)
			}()
			assert.Equal(t, "a hook's bug", p, "the panic goes on")
			assert.Zero(t, gate.Status().InFlight)
			assert.Equal(t, int32(1), body.closes.Load(), "the request's body closed once")
		})
	}
}

// An answer without a Header (a base's that net/http would not give) takes
// the rate-limit headers all the same.
func TestTransportRateLimitHeadersOnAnAnswerWithoutHeader(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	resp, err := pacing.NewTransport(base, gate, pacing.WithRateLimitHeaders()).RoundTrip(post(t, pacing.WithModelName(t.Context(), "m"), `{"model":"m"}`))
	require.NoError(t, err)
	assert.Equal(t, "1000", resp.Header.Get("x-ratelimit-limit-tokens"))
	assert.Zero(t, gate.Status().InFlight)
}

// panickyFleet is a FleetCaps whose Report panics.
type panickyFleet struct{ lim *slots.Limiter }

func (f panickyFleet) AcquireAll(ctx context.Context, _ ...string) (*slots.Slot, error) {
	return f.lim.Acquire(ctx)
}
func (panickyFleet) Report(*slots.Slot, pacing.Verdict) { panic("a fleet's bug") }
func (panickyFleet) Limit(string) int                   { return slots.Unlimited }

// A fleet's Report that panics on an answer that came with an error: the
// answer's body is closed, and every slot is freed.
func TestTransportReportPanicClosesAnAnswerWithAnError(t *testing.T) {
	body := &closeCounter{Reader: strings.NewReader("partial")}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: body, Request: r}, errors.New("cut mid-answer")
	})
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	fleetLim := slots.NewLimiter(1)
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(panickyFleet{fleetLim}), pacing.WithCutLinger(0))
	assert.PanicsWithValue(t, "a fleet's bug", func() { _, _ = rt.RoundTrip(post(t, pacing.WithModelName(t.Context(), "m"), `{"model":"m"}`)) })
	assert.Equal(t, 1, body.closed, "the answer's body closed once")
	assert.Zero(t, gate.Status().InFlight)
	assert.Zero(t, fleetLim.InFlight())
}

// A body with a key that differs from "model" only in case is refused:
// encoding/json would take it for the model (and cap the request under
// it), an upstream that reads keys as written would serve the other.
// FoldedKey finds such keys at the top level only, escaped ones too.
func TestModelFieldRefusesACaseVariantKey(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"glm-5","Model":"cheap"}`:            "Model",
		`{"MODEL":"cheap"}`:                            "MODEL",
		`{"\u004dodel":"cheap","model":"glm-5"}`:       "Model",
		`{"model":"glm-5","messages":[{"Model":"x"}]}`: "",
		`{"model":"glm-5","x":{"Model":"y"}}`:          "",
		`{"model":"glm-5","note":"Model"}`:             "",
		`{"model":"glm-5"}`:                            "",
	} {
		assert.Equal(t, want, pacing.FoldedKey([]byte(body), "model"), body)
		m, err := pacing.ModelField([]byte(body))
		if want == "" {
			assert.NoError(t, err, body)
			assert.Equal(t, "glm-5", m, body)
			continue
		}
		var bad *slots.BadRequestError
		require.ErrorAs(t, err, &bad, body)
		assert.Contains(t, bad.Reason, want)
	}
	assert.Equal(t, "", pacing.FoldedKey([]byte(`{"Model":`), "model"), "not JSON: nothing")
	assert.Equal(t, "Max_Tokens", pacing.FoldedKey([]byte(`{"messages":[],"Max_Tokens":1}`), "messages", "max_tokens"))
}

// A request its base chose not to send (an error wrapping slots.ErrNotSent:
// a budget of the caller's own that refused it as it was about to go)
// charges the Gate's budgets nothing, its request neither, is told Settled
// as not Served, and frees its slot at once: it kept no upstream busy, so
// there is no cut linger.
func TestTransportNotSentChargesNothing(t *testing.T) {
	limits := pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, APIKeys: []pacing.KeyConfig{{ID: "k", BudgetLimits: limits}}})
	over := &slots.LimitError{Err: pacing.ErrOverBudget, Cap: "tenant", RetryAfter: 2 * time.Second}
	var sent atomic.Int32
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if sent.Add(1) == 1 {
			return nil, fmt.Errorf("%w: %w", slots.ErrNotSent, over)
		}
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})
	var mu sync.Mutex
	var settled []pacing.Settlement
	tr := &pacing.Trace{Settled: func(st pacing.Settlement) { mu.Lock(); settled = append(settled, st); mu.Unlock() }}
	ctx := pacing.WithTrace(pacing.WithTokens(pacing.WithModelName(t.Context(), "m"), pacing.Tokens{Input: 300, Output: 100}), tr)
	rt := pacing.NewTransport(base, gate) // the default cut linger
	_, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.ErrorIs(t, err, slots.ErrNotSent)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Zero(t, gate.Status().InFlight, "freed at once, without the cut linger")
	left := map[string]int{}
	for _, b := range gate.Budgets() {
		left[b.Cap] = b.Left
	}
	assert.Equal(t, 1000, left["tokens_per_minute"], "no tokens charged: %v", gate.Budgets())
	assert.Equal(t, 10, left["max_requests_per_minute"], "nor its request")
	mu.Lock()
	assert.Equal(t, []pacing.Settlement{{}}, settled, "told once, not Served")
	mu.Unlock()

	// The next one is sent and charged its estimate, which its answer
	// (no usage) leaves standing.
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	for _, b := range gate.Budgets() {
		left[b.Cap] = b.Left
	}
	assert.Equal(t, 600, left["tokens_per_minute"])
	assert.Equal(t, 9, left["max_requests_per_minute"])
}

// A body that is not a JSON object is a *slots.BadRequestError, null too
// (which json.Unmarshal takes for an object without fields: before, it read
// as a request that names no model); an object without "model" names none.
func TestModelFieldRefusesWhatIsNotAnObject(t *testing.T) {
	for _, body := range []string{`null`, ` null `, `[]`, `"glm-5"`, `1`, ``, `{`} {
		_, err := pacing.ModelField([]byte(body))
		var bad *slots.BadRequestError
		require.ErrorAs(t, err, &bad, "%q", body)
		assert.Contains(t, bad.Reason, "not a JSON object", "%q", body)
	}
	for _, body := range []string{`{}`, ` {"model": null} `, `{"messages":[]}`} {
		m, err := pacing.ModelField([]byte(body))
		require.NoError(t, err, body)
		assert.Empty(t, m, body)
	}
}
