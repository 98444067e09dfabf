package inflightprom_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// streams is an upstream that answers each request with a server-sent
// event, then holds the stream open until end is called for it.
type streams struct {
	srv  *httptest.Server
	mu   sync.Mutex
	ends map[string]chan struct{}
}

func newStreams(t *testing.T) *streams {
	s := &streams{ends: map[string]chan struct{}{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-s.end(r.URL.Query().Get("id")):
			fmt.Fprint(w, "data: [DONE]\n\n")
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *streams) end(id string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ends[id] == nil {
		s.ends[id] = make(chan struct{})
	}
	return s.ends[id]
}

// send sends request id for model through rt, with p's Trace; it returns
// the answer once its first event has come, or the refusal.
func (s *streams) send(t *testing.T, rt http.RoundTripper, p *inflightprom.Provider, id, model string) (*http.Response, error) {
	t.Helper()
	ctx := pacing.WithTrace(t.Context(), p.Trace(model))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/v1/chat/completions?id="+id,
		strings.NewReader(`{"model":"`+model+`","stream":true}`))
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data:"))
	return resp, nil
}

// Requests through a real Transport to an upstream that streams: each cap
// counts what its requests held, a refusal is counted once under the cap
// that refused it, and a stream's slots count as released once it ends.
func TestProviderMetrics(t *testing.T) {
	cfg := pacing.Config{
		MaxConcurrentRequests: 2, MaxQueue: 1, MaxQueueWaitMS: 30,
		Models:  map[string]pacing.ModelConfig{"glm-5": {MaxConcurrentRequests: 1}},
		APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 1}, {ID: "k2", MaxConcurrentRequests: 1}},
	}
	gate, err := pacing.NewGate("zai", cfg)
	require.NoError(t, err)
	defer gate.Close()
	p := inflightprom.NewProvider(gate, cfg)
	reg := prometheus.NewRegistry()
	reg.MustRegister(p)
	up := newStreams(t)
	rt := pacing.NewTransport(up.srv.Client().Transport, gate)

	a, err := up.send(t, rt, p, "a", "glm-5")
	require.NoError(t, err)
	_, err = up.send(t, rt, p, "b", "glm-5") // its model is full
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	c, err := up.send(t, rt, p, "c", "glm-4-air") // a model the config does not name
	require.NoError(t, err)
	_, err = up.send(t, rt, p, "d", "glm-4-air") // the provider is full
	require.ErrorIs(t, err, slots.ErrWaitTimeout)

	const held = `
# HELP inflight_acquired_total Admissions that took capacity.
# TYPE inflight_acquired_total counter
inflight_acquired_total{cap="api_key:k1"} 1
inflight_acquired_total{cap="api_key:k2"} 1
inflight_acquired_total{cap="api_keys"} 0
inflight_acquired_total{cap="model:glm-5"} 1
inflight_acquired_total{cap="model:other"} 1
inflight_acquired_total{cap="provider"} 2
# HELP inflight_in_flight Units held now (one per slot unless weighted); a slot held under several keys counts under each.
# TYPE inflight_in_flight gauge
inflight_in_flight{cap="api_key:k1"} 1
inflight_in_flight{cap="api_key:k2"} 1
inflight_in_flight{cap="api_keys"} 2
inflight_in_flight{cap="model:glm-5"} 1
inflight_in_flight{cap="model:other"} 1
inflight_in_flight{cap="provider"} 2
# HELP inflight_limit The limit; +Inf when unlimited.
# TYPE inflight_limit gauge
inflight_limit{cap="api_key:k1"} 1
inflight_limit{cap="api_key:k2"} 1
inflight_limit{cap="api_keys"} 2
inflight_limit{cap="model:glm-5"} 1
inflight_limit{cap="model:other"} +Inf
inflight_limit{cap="provider"} 2
# HELP inflight_released_total Capacity given back.
# TYPE inflight_released_total counter
inflight_released_total{cap="api_key:k1"} 0
inflight_released_total{cap="api_key:k2"} 0
inflight_released_total{cap="api_keys"} 0
inflight_released_total{cap="model:glm-5"} 0
inflight_released_total{cap="model:other"} 0
inflight_released_total{cap="provider"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(held),
		"inflight_acquired_total", "inflight_in_flight", "inflight_limit", "inflight_released_total"))
	rejected := func(capName, reason string) float64 {
		if v, ok := rejections(t, p)[capName+"/"+reason]; ok {
			return v
		}
		return -1 // no such series
	}
	assert.Equal(t, 1.0, rejected("model:glm-5", "wait_timeout"), "its model's cap refused it")
	assert.Equal(t, 1.0, rejected("provider", "wait_timeout"), "the provider's cap refused it")
	assert.Equal(t, 0.0, rejected("model:other", "wait_timeout"), "counted once, under the cap that refused")
	assert.Equal(t, -1.0, rejected("api_key:k1", "wait_timeout"), "a key never refuses")

	// A stream that ends frees its slots: released, with its hold.
	close(up.end("a"))
	_, err = io.Copy(io.Discard, a.Body)
	require.NoError(t, err)
	require.NoError(t, a.Body.Close())
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(only1(p, "model:glm-5"), "inflight_released_total")))
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(only1(p, "provider"), "inflight_released_total")))
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(only1(p, "api_key:k1"), "inflight_released_total")))
	assert.Equal(t, 0.0, testutil.ToFloat64(collectorFor(only1(p, "model:glm-5"), "inflight_in_flight")))
	// A client that walks away mid-stream frees them too.
	c.Body.Close()
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(collectorFor(only1(p, "provider"), "inflight_released_total")) == 2
	}, 5*time.Second, time.Millisecond, "the cut stream's release (after the Transport's linger)")
	assert.Equal(t, 0, gate.Status().InFlight)
	st, ok := p.Snapshot("model:glm-5")
	require.True(t, ok)
	assert.Equal(t, uint64(1), st.Counts.Rejected["wait_timeout"])
	assert.Equal(t, uint64(1), st.Counts.Released)
	assert.Equal(t, 1, st.Limit)
	_, ok = p.Snapshot("model:glm-4-air")
	assert.False(t, ok, "an unnamed model is counted under model:other")
	// Each admitted cap has its wait and hold histograms.
	assert.Equal(t, 2, testutil.CollectAndCount(only1(p, "provider"), "inflight_wait_seconds", "inflight_hold_seconds"))
}

// only1 keeps the series of one cap of a Provider.
func only1(p *inflightprom.Provider, capName string) prometheus.Collector {
	return capOnly{p, capName}
}

type capOnly struct {
	p    *inflightprom.Provider
	name string
}

func (o capOnly) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(o, ch) }
func (o capOnly) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 256)
	o.p.Collect(all)
	close(all)
	for m := range all {
		if strings.Contains(m.Desc().String(), `{cap="`+o.name+`"}`) {
			ch <- m
		}
	}
}

// The wait for a fleet's caps counts as waiting on the model's cap and the
// provider's; a refusal the Provider does not know is named by
// WithRejectReason; the learned limits come from WithLearner.
func TestProviderFleetWaitAndOptions(t *testing.T) {
	cfg := pacing.Config{MaxConcurrentRequests: 4, Models: map[string]pacing.ModelConfig{"m": {}, "other": {}}}
	gate, err := pacing.NewGate("p", cfg)
	require.NoError(t, err)
	defer gate.Close()
	errDown := errors.New("store down")
	learned := fixedLearner{pacing.Learned{Enabled: true, Limit: 3, Floor: 1, Models: map[string]pacing.Learned{"m": {Enabled: true, Limit: 2, Floor: 1}}}}
	p := inflightprom.NewProvider(gate, cfg, nil, inflightprom.WithLearner(learned),
		inflightprom.WithRejectReason(func(err error) string {
			if errors.Is(err, errDown) {
				return "unavailable"
			}
			return ""
		}))
	tr := p.Trace("m")
	done := tr.FleetWait()
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(only1(p, "model:m"), "inflight_waiting")))
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(only1(p, "provider"), "inflight_waiting")))
	done()
	assert.Equal(t, 0.0, testutil.ToFloat64(collectorFor(only1(p, "provider"), "inflight_waiting")))
	assert.Equal(t, 3.0, testutil.ToFloat64(collectorFor(only1(p, "provider"), "inflight_limit")), "learned")
	assert.Equal(t, 2.0, testutil.ToFloat64(collectorFor(only1(p, "model:m"), "inflight_limit")), "learned")

	tr.Refused(fmt.Errorf("fleet: %w", errDown))
	tr.Refused(errors.New("something else"))
	tr.Refused(fmt.Errorf("acquire: %w", context.Canceled))
	p.Trace("not-named").Refused(&slots.LimitError{Err: slots.ErrQueueFull, Cap: pacing.CapModel})
	got := map[string]float64{}
	for k, v := range rejections(t, p) {
		if v > 0 {
			got[k] = v
		}
	}
	assert.Equal(t, map[string]float64{
		"provider/unavailable": 1, "provider/other": 1, "provider/canceled": 1,
		"model:other (unnamed)/queue_full": 1, // a model named "other" keeps "model:other"
	}, got)
}

type fixedLearner struct{ l pacing.Learned }

func (f fixedLearner) Learned() pacing.Learned { return f.l }

// rejections returns a Provider's inflight_rejected_total series, by
// "cap/reason".
func rejections(t *testing.T, p *inflightprom.Provider) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(p))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "inflight_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var capName, reason string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "cap":
					capName = l.GetValue()
				case "reason":
					reason = l.GetValue()
				}
			}
			out[capName+"/"+reason] = m.GetCounter().GetValue()
		}
	}
	return out
}

// Every key out of its budget is the pool's refusal; model names that would
// give two caps one label are told apart.
func TestProviderKeyBudgetsAndNames(t *testing.T) {
	cfg := pacing.Config{
		MaxQueue: 1, MaxQueueWaitMS: 20,
		Models:  map[string]pacing.ModelConfig{"other": {}, "other (unnamed)": {}},
		APIKeys: []pacing.KeyConfig{{ID: "k1", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}}},
	}
	gate, err := pacing.NewGate("p", cfg)
	require.NoError(t, err)
	defer gate.Close()
	p := inflightprom.NewProvider(gate, cfg)
	g, err := gate.Acquire(t.Context(), "m")
	require.NoError(t, err)
	g.Slot.Release()
	_, err = gate.Acquire(t.Context(), "m")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "api_key_"+pacing.CapMaxRequestsPerMinute, le.Cap)
	p.Trace("m").Refused(err)
	got := rejections(t, p) // a pedantic registry: no two caps share a label
	assert.Equal(t, 1.0, got["api_keys/over_budget"], "refused at once: no key's budget takes it within the wait")
	assert.Zero(t, got["api_keys/wait_timeout"])
	assert.Zero(t, got["provider/wait_timeout"])
	_, ok := p.Snapshot("model:other (unnamed) (unnamed)")
	assert.True(t, ok, "the unnamed models' cap takes a name no model has")
}

// Many clients at once, some walking away mid-stream, some refused: once
// all have gone, each cap has released what it admitted, the provider has
// counted each request once (admitted or refused), and nothing is left in
// flight or waiting. The Gate's own count is the independent one.
func TestProviderHammer(t *testing.T) {
	cfg := pacing.Config{
		MaxConcurrentRequests: 4, MaxQueue: 6, MaxQueueWaitMS: 40,
		Models:  map[string]pacing.ModelConfig{"a": {MaxConcurrentRequests: 2}, "b": {}},
		APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 2}, {ID: "k2", MaxConcurrentRequests: 3}},
	}
	gate, err := pacing.NewGate("p", cfg)
	require.NoError(t, err)
	defer gate.Close()
	p := inflightprom.NewProvider(gate, cfg)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 3 {
			fmt.Fprint(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-time.After(time.Duration(1+len(r.URL.RawQuery)%5) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}))
	defer up.Close()
	rt := pacing.NewTransport(up.Client().Transport, gate, pacing.WithCutLinger(5*time.Millisecond))
	models := []string{"a", "b", "c", "d"}
	const clients, each = 16, 12
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				model := models[(c+i)%len(models)]
				ctx, cancel := context.WithCancel(pacing.WithTrace(t.Context(), p.Trace(model)))
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/?%d", up.URL, c*each+i),
					strings.NewReader(`{"model":"`+model+`","stream":true}`))
				resp, err := rt.RoundTrip(req)
				if err == nil {
					if (c+i)%3 == 0 {
						bufio.NewReader(resp.Body).ReadString('\n') // walks away after the first event
						resp.Body.Close()
					} else {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
				cancel()
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return gate.Status().InFlight == 0 }, 5*time.Second, time.Millisecond, "the cut streams' linger")
	var admitted, refused uint64
	for _, name := range []string{"provider", "model:a", "model:other", "api_key:k1", "api_key:k2", "api_keys"} {
		s, ok := p.Snapshot(name)
		require.True(t, ok, name)
		assert.Zero(t, s.InFlight, name)
		assert.Equal(t, s.Counts.Acquired, s.Counts.Released, "%s released what it admitted", name)
		assert.Zero(t, s.Counts.Bypassed, name)
		if name == "provider" {
			admitted = s.Counts.Acquired
		}
		for _, n := range s.Counts.Rejected {
			refused += n
		}
		if s.Waiting >= 0 {
			assert.Zero(t, s.Waiting, name)
		}
	}
	assert.Equal(t, uint64(clients*each), admitted+refused, "each request counted once: admitted %d, refused %d", admitted, refused)
	k1, _ := p.Snapshot("api_key:k1")
	k2, _ := p.Snapshot("api_key:k2")
	assert.Equal(t, admitted, k1.Counts.Acquired+k2.Counts.Acquired, "each admission held one key")
	t.Logf("%d requests: %d admitted, %d refused", clients*each, admitted, refused)
}
