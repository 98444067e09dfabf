package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A short stream that comes with its Content-Length (an upstream that
// ended before it flushed) reaches the client whole without the usage
// chunk the gateway asked for (pacing.WithStreamUsage): the length, which
// no longer holds, is not passed on.
func TestGatewayStreamUsageContentLength(t *testing.T) {
	body := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n" +
		"data: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	t.Cleanup(up.Close)
	srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s", "orgs": {"default_limit": 10}, "provider": {"tokens_per_minute": 100000}}`)
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "the whole stream, no unexpected EOF")
	assert.Equal(t, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", string(got))
}
