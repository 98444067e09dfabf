package gateway

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	sim "github.com/inflight-go/inflight/examples/internal/upstream"
)

// BenchmarkStreamOverhead measures what the gateway adds to a streamed
// answer: 256 streams of 200 ms (a token every 20 ms), 64 at a time,
// straight to the simulated provider and through a gateway whose caps
// never bind, in pairs of runs (which goes first alternates). It reports
// the median over the pairs of the ratio of the p50 latencies, to the end
// of the stream and to the first byte, and each side's medians.
//
//	go test ./examples/internal/gateway -run '^$' -bench StreamOverhead -benchtime 8x
func BenchmarkStreamOverhead(b *testing.B) {
	const streams, concurrent = 256, 64
	prov := sim.New(1 << 20)
	up := httptest.NewServer(prov)
	defer up.Close()
	cfg, err := ParseConfig(fmt.Appendf(nil, `{"upstream": %q, "orgs": {"default_limit": 100000},
		"provider": {"max_concurrent_requests": 100000, "max_queue": 100000}}`, up.URL))
	require.NoError(b, err)
	base := &http.Transport{MaxIdleConnsPerHost: concurrent}
	defer base.CloseIdleConnections()
	gw, err := New(cfg, base, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(b, err)
	defer gw.Close()
	front := httptest.NewServer(gw)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrent}}
	defer client.CloseIdleConnections()

	run := func(url string) (end, first time.Duration) {
		var (
			mu           sync.Mutex
			ends, firsts []time.Duration
			wg           sync.WaitGroup
			sem          = make(chan struct{}, concurrent)
		)
		for range streams {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				t0 := time.Now()
				resp, err := client.Post(url+"/v1/chat/completions", "application/json",
					bytes.NewReader([]byte(`{"model":"glm-5","stream":true,"turn_ms":200}`)))
				if err != nil {
					b.Error(err)
					return
				}
				defer resp.Body.Close()
				var one [1]byte
				if _, err := io.ReadFull(resp.Body, one[:]); err != nil {
					b.Error(err)
					return
				}
				f := time.Since(t0)
				if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
					b.Errorf("status %d, %v", resp.StatusCode, err)
					return
				}
				mu.Lock()
				ends, firsts = append(ends, time.Since(t0)), append(firsts, f)
				mu.Unlock()
			})
		}
		wg.Wait()
		return median(ends), median(firsts)
	}

	var endRatios, firstRatios, directEnds, gatewayEnds, directFirsts, gatewayFirsts []float64
	b.ResetTimer()
	for i := range b.N {
		var dEnd, dFirst, gEnd, gFirst time.Duration
		if i%2 == 0 {
			dEnd, dFirst = run(up.URL)
			gEnd, gFirst = run(front.URL)
		} else {
			gEnd, gFirst = run(front.URL)
			dEnd, dFirst = run(up.URL)
		}
		endRatios = append(endRatios, float64(gEnd)/float64(dEnd))
		firstRatios = append(firstRatios, float64(gFirst)/float64(dFirst))
		directEnds = append(directEnds, float64(dEnd)/1e6)
		gatewayEnds = append(gatewayEnds, float64(gEnd)/1e6)
		directFirsts = append(directFirsts, float64(dFirst)/1e6)
		gatewayFirsts = append(gatewayFirsts, float64(gFirst)/1e6)
	}
	b.StopTimer()
	b.ReportMetric(medianOf(endRatios), "p50-end-ratio")
	b.ReportMetric(medianOf(firstRatios), "p50-first-byte-ratio")
	b.ReportMetric(medianOf(directEnds), "direct-p50-ms")
	b.ReportMetric(medianOf(gatewayEnds), "gateway-p50-ms")
	b.ReportMetric(medianOf(directFirsts), "direct-first-byte-ms")
	b.ReportMetric(medianOf(gatewayFirsts), "gateway-first-byte-ms")
	b.ReportMetric(0, "ns/op")
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}
