package pacing_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/inflight-go/inflight/pacing"
)

// BenchmarkTransportRoundTrip is a request through the Transport to a
// loopback server answering a small JSON body, beside the same request
// through its base alone, in the same run: the Transport's own cost on a
// request sent over the network.
func BenchmarkTransportRoundTrip(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":2}}`))
	}))
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 4}
	defer base.CloseIdleConnections()
	g, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{{"base", base}, {"transport", pacing.NewTransport(base, g)}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := pacing.WithModelName(b.Context(), "m")
			b.ReportAllocs()
			for b.Loop() {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				if err != nil {
					b.Fatal(err)
				}
				resp, err := c.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
