package slots_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inflight-go/inflight/slots"
)

// benchStreamers is the number of streaming requests in flight at once in
// BenchmarkTransportStreaming, and also the Limiter's limit there: the cap is
// real, but with one request per goroutine it never binds.
const benchStreamers = 64

// benchSSEEvents are the events of one streamed answer, as a chat completion
// API sends them: eight chunks, then the [DONE] marker. They are built once,
// so the handler allocates nothing of its own per request.
var benchSSEEvents = func() [][]byte {
	var evs [][]byte
	for _, tok := range []string{"The", " quick", " brown", " fox", " jumps", " over", " the", " dog"} {
		evs = append(evs, []byte(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"`+tok+`"}}]}`+"\n\n"))
	}
	return append(evs, []byte("data: [DONE]\n\n"))
}()

// benchRequestBody is the body of each streamed request.
const benchRequestBody = `{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// benchSSEHandler answers every request with benchSSEEvents, flushing each
// event, without delays: the benchmark measures the HTTP path, not the model.
func benchSSEHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	f := w.(http.Flusher)
	for _, ev := range benchSSEEvents {
		if _, err := w.Write(ev); err != nil {
			return
		}
		f.Flush()
	}
}

// benchBaseTransport is the transport under both sub-benchmarks: it keeps an
// idle connection for every concurrent stream, so the steady state reuses
// connections instead of dialling.
func benchBaseTransport() *http.Transport {
	return &http.Transport{
		MaxIdleConns:        2 * benchStreamers,
		MaxIdleConnsPerHost: 2 * benchStreamers,
		IdleConnTimeout:     time.Minute,
	}
}

// benchSetStreamers makes the next RunParallel start benchStreamers
// goroutines: RunParallel starts parallelism*GOMAXPROCS, so round up.
func benchSetStreamers(b *testing.B) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((benchStreamers + procs - 1) / procs)
}

// benchStream runs the parallel loop: each op is one complete streamed
// request (Do, read the body to its end, Close). Besides ns/op (wall time
// per request across all streams) it reports latency-ns: the mean time one
// request took from Do to Close, as a caller sees it.
//
// With withCancel each request carries a context of its own that can end, as
// a proxied request does (the server's request context); without, it carries
// context.Background, which never ends.
func benchStream(b *testing.B, client *http.Client, url string, withCancel bool) {
	var totalNanos, totalReqs atomic.Int64
	b.ReportAllocs()
	benchSetStreamers(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var nanos, reqs int64
		for pb.Next() {
			start := time.Now()
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if withCancel {
				ctx, cancel = context.WithCancel(ctx)
			}
			ok := benchOne(b, client, ctx, url)
			cancel()
			if !ok {
				return
			}
			nanos += int64(time.Since(start))
			reqs++
		}
		totalNanos.Add(nanos)
		totalReqs.Add(reqs)
	})
	b.StopTimer()
	if n := totalReqs.Load(); n > 0 {
		b.ReportMetric(float64(totalNanos.Load())/float64(n), "latency-ns")
	}
}

// benchOne runs one streamed request to its end and reports whether it went
// well.
func benchOne(b *testing.B, client *http.Client, ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(benchRequestBody))
	if err != nil {
		b.Error(err)
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := client.Do(req)
	if err != nil {
		b.Error(err)
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		b.Error(err)
		return false
	}
	if resp.StatusCode != http.StatusOK {
		b.Errorf("status %d", resp.StatusCode)
		return false
	}
	return true
}

// BenchmarkTransportStreaming compares a Transport-wrapped round trip with
// the bare http.Transport under it, over loopback, with benchStreamers
// streaming (SSE) requests in flight at once. The target: inflight within
// 1.05x of bare in time and at most 3 more allocs per request. The
// sub-benchmarks run one after the other, so the machine's drift between
// them shows in the latency; BenchmarkTransportStreamingInterleaved
// compares the latencies within one run.
func BenchmarkTransportStreaming(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(benchSSEHandler))
	defer srv.Close()

	for _, ctxName := range []string{"background", "cancellable"} {
		withCancel := ctxName == "cancellable"
		b.Run(ctxName+"/bare", func(b *testing.B) {
			tr := benchBaseTransport()
			defer tr.CloseIdleConnections()
			benchStream(b, &http.Client{Transport: tr}, srv.URL, withCancel)
		})

		b.Run(ctxName+"/inflight", func(b *testing.B) {
			base := benchBaseTransport()
			defer base.CloseIdleConnections()
			lim := slots.NewLimiter(benchStreamers)
			tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) {
				return lim.Acquire(r.Context())
			})
			benchStream(b, &http.Client{Transport: tr}, srv.URL, withCancel)

			// The cap must have been real but never binding, and every
			// slot must have come back with its stream.
			st := lim.Stats()
			if st.Waited != 0 {
				b.Errorf("%d requests waited for a slot; the limit bound", st.Waited)
			}
			if st.InFlight != 0 {
				b.Errorf("%d slots still held after all streams ended", st.InFlight)
			}
			if st.Acquired != st.Released {
				b.Errorf("acquired %d slots, released %d", st.Acquired, st.Released)
			}
		})
	}
}

// BenchmarkTransportStreamingInterleaved measures the latency target of
// BenchmarkTransportStreaming with the two clients interleaved: each of the
// benchStreamers goroutines alternates a request through the bare transport
// and one through the Transport, so that both see the same load and the
// same drift of the machine. It reports each mean latency and their ratio
// (latency-ratio, inflight over bare). Allocations are for the pair.
func BenchmarkTransportStreamingInterleaved(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(benchSSEHandler))
	defer srv.Close()

	for _, ctxName := range []string{"background", "cancellable"} {
		withCancel := ctxName == "cancellable"
		b.Run(ctxName, func(b *testing.B) {
			bareBase, base := benchBaseTransport(), benchBaseTransport()
			defer bareBase.CloseIdleConnections()
			defer base.CloseIdleConnections()
			lim := slots.NewLimiter(benchStreamers)
			clients := [2]*http.Client{
				{Transport: bareBase},
				{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) {
					return lim.Acquire(r.Context())
				})},
			}
			var nanos, reqs [2]atomic.Int64
			b.ReportAllocs()
			benchSetStreamers(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var n, k [2]int64
				for i := 0; pb.Next(); i++ {
					which := i % 2
					start := time.Now()
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if withCancel {
						ctx, cancel = context.WithCancel(ctx)
					}
					ok := benchOne(b, clients[which], ctx, srv.URL)
					cancel()
					if !ok {
						return
					}
					n[which] += int64(time.Since(start))
					k[which]++
				}
				for i := range 2 {
					nanos[i].Add(n[i])
					reqs[i].Add(k[i])
				}
			})
			b.StopTimer()
			if reqs[0].Load() == 0 || reqs[1].Load() == 0 {
				return
			}
			bare := float64(nanos[0].Load()) / float64(reqs[0].Load())
			inflight := float64(nanos[1].Load()) / float64(reqs[1].Load())
			b.ReportMetric(bare, "bare-latency-ns")
			b.ReportMetric(inflight, "inflight-latency-ns")
			b.ReportMetric(inflight/bare, "latency-ratio")
			if st := lim.Stats(); st.InFlight != 0 || st.Waited != 0 {
				b.Errorf("limiter: %d in flight at the end, %d waited", st.InFlight, st.Waited)
			}
		})
	}
}
