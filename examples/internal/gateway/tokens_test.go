package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEstimateTokens(t *testing.T) {
	e, err := newEstimator(&TokensConfig{ExpectedOutput: 100, Models: map[string]int{"short": 10}})
	require.NoError(t, err)
	hello, err := e.codec.Count("hello world")
	require.NoError(t, err)
	require.Equal(t, 2, hello, "o200k_base: two tokens")
	for _, tc := range []struct {
		name, model, body string
		want              int
	}{
		{"a message and the expected answer", "m", `{"messages":[{"role":"user","content":"hello world"}]}`, 2 + perMessage + 100},
		{"max_tokens bounds the answer", "m", `{"messages":[{"content":"hello world"}],"max_tokens":1}`, 2 + perMessage + 1},
		{"max_completion_tokens too", "m", `{"messages":[{"content":"hello world"}],"max_completion_tokens":7}`, 2 + perMessage + 7},
		{"a model's expected answer", "short", `{"messages":[{"content":"hello world"}]}`, 2 + perMessage + 10},
		{"parts: text counted, images not", "m", `{"messages":[{"content":[{"type":"text","text":"hello world"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, 2 + perMessage + 100},
		{"a completion's prompt", "m", `{"prompt":"hello world","max_tokens":0}`, 2},
		{"nothing: at least one", "m", `{"max_tokens":0}`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := e.estimate([]byte(tc.body), tc.model)
			require.NoError(t, err)
			assert.Equal(t, tc.want, n)
		})
	}
	_, err = e.estimate([]byte(`{"messages":[{"content":42}]}`), "m")
	assert.Error(t, err, "content that is neither text nor parts")
}

const tokensConfig = `{
	"upstream": "%s",
	"orgs": {"default_limit": 10},
	"tokens": {"expected_output": 100},
	"provider": {"max_concurrent_requests": 10, "max_inflight_tokens": 1000}
}`

// The gateway weighs each request by its estimated tokens against the
// provider's max_inflight_tokens: a stream holds its tokens until it ends,
// and a prompt larger than the cap is answered 413 at once, naming the cap.
func TestGatewayWeighsRequestsByTokens(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, tokensConfig)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	send := func(ctx context.Context, content string) (*http.Response, error) {
		body, err := json.Marshal(map[string]any{"model": "m", "stream": true,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(string(body)))
		require.NoError(t, err)
		return client.Do(req)
	}
	resp, err := send(context.Background(), "hello world")
	require.NoError(t, err)
	waitFor(t, "the stream is open", func() bool { return u.get(u.cur, "all") == 1 })
	assert.Equal(t, 2+perMessage+100, gw.gate.Status().Tokens, "its prompt and expected answer are in flight")
	text := scrape(t, client, srv.URL)
	assert.Contains(t, text, fmt.Sprintf(`inflight_tokens{cap="provider"} %d`, 2+perMessage+100))
	assert.Contains(t, text, `inflight_token_limit{cap="provider"} 1000`)

	big, err := send(context.Background(), strings.Repeat("hello world ", 600))
	require.NoError(t, err)
	defer big.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, big.StatusCode)
	assert.Equal(t, "tokens", big.Header.Get(CapHeader))
	assert.Empty(t, big.Header.Get("Retry-After"), "coming back cannot help")
	assert.Equal(t, 1, u.get(u.peak, "all"), "the upstream never saw it")

	close(u.gate) // the stream ends
	_, _ = resp.Body.Read(make([]byte, 1024))
	resp.Body.Close()
	waitFor(t, "its tokens are freed", func() bool { return gw.gate.Status().Tokens == 0 })
}
