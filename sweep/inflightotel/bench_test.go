package inflightotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkAdmission: Acquire and Release under a context without a span,
// with no MeterProvider installed, beside the same without an Observer,
// with an Observer that does nothing (the floor of one told every Event),
// with one whose Enabled declines at once (the floor of one asked first)
// and with one that only looks for a recording span in the context (the
// floor of one that puts admissions on their traces): what the adapter
// adds to an admission when nothing is traced or collected.
func BenchmarkAdmission(b *testing.B) {
	c, err := inflightotel.New("provider")
	if err != nil {
		b.Fatal(err)
	}
	nop := slots.ObserverFunc(func(slots.Event) {})
	ctx := slots.WithPriority(context.Background(), slots.PriorityBatch)
	for _, tc := range []struct {
		name string
		opts []slots.Option
	}{
		{"bare", nil},
		{"nop-observer", []slots.Option{slots.WithObserver(nop)}},
		{"declining-observer", []slots.Option{slots.WithObserver(declining{})}},
		{"span-lookup-observer", []slots.Option{slots.WithObserver(spanLookup{})}},
		{"inflightotel", []slots.Option{slots.WithObserver(c)}},
	} {
		b.Run("limiter/"+tc.name, func(b *testing.B) {
			l := slots.NewLimiter(8, tc.opts...)
			b.ReportAllocs()
			for b.Loop() {
				s, err := l.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				s.Release()
			}
		})
		b.Run("registry/"+tc.name, func(b *testing.B) {
			ropts := make([]registry.Option, len(tc.opts))
			for i, o := range tc.opts {
				ropts[i] = o
			}
			r := registry.New[string](8, ropts...)
			b.ReportAllocs()
			for b.Loop() {
				s, err := r.Acquire(ctx, "org-a")
				if err != nil {
					b.Fatal(err)
				}
				s.Release()
			}
		})
	}
}

// BenchmarkAdmissionInterleaved is BenchmarkAdmission's Limiter bare,
// with the span-lookup Observer and with the adapter, run in turns of
// 1,000 admissions each, in an order that rotates, so that a busy
// machine's drift falls on all three alike. It reports the median of the
// turns' ns per admission and of the adapter's ratios to the others in
// the same round (the goal: at most 1.05 the span lookup's, which putting
// admissions on traces needs anyway).
func BenchmarkAdmissionInterleaved(b *testing.B) {
	c, err := inflightotel.New("provider")
	if err != nil {
		b.Fatal(err)
	}
	ctx := slots.WithPriority(context.Background(), slots.PriorityBatch)
	lims := [3]*slots.Limiter{slots.NewLimiter(8), slots.NewLimiter(8, slots.WithObserver(spanLookup{})),
		slots.NewLimiter(8, slots.WithObserver(c))}
	const turn = 1000
	var took [3][]float64 // ns per admission, each round
	var xSpan, xBare []float64
	round := 0
	for b.Loop() {
		var d [3]float64
		for j := range lims {
			i := (round + j) % len(lims)
			start := time.Now()
			for range turn {
				s, err := lims[i].Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				s.Release()
			}
			d[i] = float64(time.Since(start)) / turn
			took[i] = append(took[i], d[i])
		}
		xSpan, xBare = append(xSpan, d[2]/d[1]), append(xBare, d[2]/d[0])
		round++
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	for i, name := range []string{"bare", "span", "inflightotel"} {
		b.ReportMetric(median(took[i]), name+"-ns/adm")
	}
	b.ReportMetric(median(xSpan), "x-span")
	b.ReportMetric(median(xBare), "x-bare")
}

// spanLookup is an Observer that wants an Event only under a recording
// span: the least one that traces admissions (the wait on the trace) can
// ask.
type spanLookup struct{ declining }

func (spanLookup) Enabled(ctx context.Context) bool {
	return ctx != nil && trace.SpanFromContext(ctx).IsRecording()
}

// declining is an Observer that wants no Event.
type declining struct{}

func (declining) Observe(slots.Event)          {}
func (declining) Enabled(context.Context) bool { return false }

// BenchmarkRoundTrip: a request through slots.Transport to a loopback
// server, the admission an HTTP client or proxy makes, with and without
// the adapter (no SDK, no span).
func BenchmarkRoundTrip(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	c, err := inflightotel.New("provider")
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts []slots.Option
	}{
		{"bare", nil},
		{"inflightotel", []slots.Option{slots.WithObserver(c)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l := slots.NewLimiter(8, tc.opts...)
			base := &http.Transport{MaxIdleConnsPerHost: 8}
			defer base.CloseIdleConnections()
			hc := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return l.Acquire(r.Context()) })}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := hc.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
}
