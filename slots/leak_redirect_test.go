package slots_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// http.Client follows redirects through the Transport with leak
// detection, over HTTP/1.1 and HTTP/2: the intermediate copies' bodies are
// drained and closed by the client, the final response's Request.Response
// is the intermediate copy, and nothing is reported leaked.
func TestTransportRedirectsWithLeakDetection(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "h1", true: "h2"}[h2], func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("/a", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Hop", "a")
				http.Redirect(w, r, "/b", http.StatusFound)
			})
			mux.HandleFunc("/b", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-End")
				_, _ = io.WriteString(w, "done")
				w.Header().Set("X-End", "yes")
			})
			up := httptest.NewUnstartedServer(mux)
			base := startTLS(t, up, h2)
			lim := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithLogger(slog.New(slog.DiscardHandler)))
			client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })}
			resp, err := client.Get(up.URL + "/a")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, "done", string(body))
			assert.Equal(t, "yes", resp.Trailer.Get("X-End"))
			require.NotNil(t, resp.Request.Response)
			assert.Equal(t, http.StatusFound, resp.Request.Response.StatusCode)
			assert.Equal(t, "a", resp.Request.Response.Header.Get("X-Hop"))
			assert.Zero(t, lim.InFlight())
			for range 5 {
				runtime.GC()
			}
			require.Eventually(t, func() bool { runtime.GC(); return lim.InFlight() == 0 }, time.Second, time.Millisecond)
			assert.Zero(t, lim.Stats().Leaked)
		})
	}
}
