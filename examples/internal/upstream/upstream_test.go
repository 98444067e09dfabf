package upstream_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/pacing/pacingtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A turn too long for a time.Duration is a long turn, not one that has
// already ended.
func TestProviderHugeTurn(t *testing.T) {
	srv := httptest.NewServer(upstream.New(1))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"model":"glm-5","turn_ms":9223372036854775807}`))
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n", line)
	cancel()
}

// Hidden over HTTP: a request within the hidden cap streams for its service
// time and ends with [DONE]; one over it is a 429 with Retry-After; the
// peak counts both, as the account sees them.
func TestHidden(t *testing.T) {
	u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{Cap: 1}}, RefusalDelay: time.Millisecond, HeaderDelay: time.Millisecond}
	u.Start()
	h := upstream.NewHidden(u)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	send := func(ctx context.Context, service string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"model":"glm-5"}`))
		require.NoError(t, err)
		req.Header.Set(pacingtest.ServiceHeader, service)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		return resp
	}
	held := send(context.Background(), "1h") // holds the one place until it is closed
	assert.Equal(t, http.StatusOK, held.StatusCode)
	refused := send(context.Background(), "1ms")
	body, err := io.ReadAll(refused.Body)
	refused.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, refused.StatusCode)
	assert.Equal(t, "1", refused.Header.Get("Retry-After"))
	assert.JSONEq(t, `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`, string(body))
	assert.Equal(t, 2, h.Peak(), "the refused request was open too")
	held.Body.Close() // the client goes away: the provider lets the request go
	require.Eventually(t, func() bool { return h.Open() == 0 }, 5*time.Second, time.Millisecond)

	h.ResetPeak()
	served := send(context.Background(), "5ms")
	body, err = io.ReadAll(served.Body)
	served.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "data: [DONE]\n\n", string(body))
	assert.Equal(t, 1, h.Peak())
	assert.Zero(t, h.Open(), "a request has ended at the provider before its client sees the end")
	assert.Equal(t, pacingtest.Counts{Attempts: 3, Refused: 1, Served: 1, Work: 5 * time.Millisecond, Peak: 1}, u.Counts())
}
