package upstream_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/examples/internal/upstream"
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
