package slots_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// An ErrorWriter that flushes before WriteHeader, over HTTP/1.1 and
// HTTP/2: the refusal's status and Retry-After go first; a Retry-After of
// the writer's own set before the flush drops the library's ms; a status
// the writer sets after flushing comes too late (net/http logs it).
func TestErrorWriterFlushEdges(t *testing.T) {
	refuse := func(*http.Request) (*slots.Slot, error) {
		return nil, &slots.LimitError{Err: slots.ErrLimitReached, RetryAfter: 300 * time.Millisecond}
	}
	cases := []struct {
		name   string
		ew     slots.ErrorWriter
		status int
		ra, ms string
	}{
		{"flush first", func(w http.ResponseWriter, _ int, msg string) {
			http.NewResponseController(w).Flush()
			io.WriteString(w, msg)
		}, 429, "1", "300"},
		{"own Retry-After, then flush", func(w http.ResponseWriter, _ int, msg string) {
			w.Header().Set("Retry-After", "60")
			w.(http.Flusher).Flush()
			io.WriteString(w, msg)
		}, 429, "60", ""},
		{"flush, then own status", func(w http.ResponseWriter, _ int, msg string) {
			w.(http.Flusher).Flush()
			w.WriteHeader(503)
			io.WriteString(w, msg)
		}, 429, "1", "300"},
	}
	for _, tc := range cases {
		for _, h2 := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: " http1", true: " h2"}[h2], func(t *testing.T) {
				srv := httptest.NewUnstartedServer(slots.Middleware(refuse, slots.WithErrorWriter(tc.ew))(http.NotFoundHandler()))
				srv.EnableHTTP2 = h2
				srv.StartTLS()
				t.Cleanup(srv.Close)
				resp, err := srv.Client().Get(srv.URL)
				require.NoError(t, err)
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				assert.Equal(t, h2, resp.ProtoMajor == 2)
				assert.Equal(t, tc.status, resp.StatusCode)
				assert.Equal(t, tc.ra, resp.Header.Get("Retry-After"))
				assert.Equal(t, tc.ms, resp.Header.Get(slots.HeaderRetryAfterMs))
			})
		}
	}
}
