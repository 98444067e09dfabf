package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A stream the upstream cuts mid-way gets its access-log line all the
// same, marked aborted: the proxy ends its handler with a panic
// (http.ErrAbortHandler) that the line is logged through.
func TestAccessLogOfACutStream(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // cut mid-stream
		}
	}))
	t.Cleanup(up.Close)
	log, logs := newTestLogger(slog.LevelInfo)
	srv, gw := startGatewayWith(t, up.URL, testConfig, WithLogger(log))
	resp, err := post(context.Background(), t, srv.Client(), srv.URL, "org-z", "glm-5.3")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitFor(t, "the cut stream's access-log line", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `msg="gateway: request"`) && strings.Contains(line, "org=org-z") && strings.Contains(line, "aborted=true") {
				return true
			}
		}
		return false
	})
	waitFor(t, "released", func() bool { return gw.Provider().InFlight == 0 })
}
