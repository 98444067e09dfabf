package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	simulated "github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
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
		{"a prompt of token ids", "m", `{"prompt":[1,2,3],"max_tokens":0}`, 3},
		{"prompts of token ids", "m", `{"prompt":[[1,2],[3]],"max_tokens":0}`, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := e.estimate([]byte(tc.body), tc.model, false)
			require.NoError(t, err)
			assert.Equal(t, tc.want, n.Total())
		})
	}
	_, err = e.estimate([]byte(`{"messages":[{"content":42}]}`), "m", false)
	assert.Error(t, err, "content that is neither text nor parts")
}

// A request for n choices may take n answers, each up to its max_tokens
// (OpenAI charges the tokens of all of them): a server generating them
// holds them all. Before, n was not read and one answer was counted.
func TestEstimateTokensOfNChoices(t *testing.T) {
	e, err := newEstimator(&TokensConfig{ExpectedOutput: 100})
	require.NoError(t, err)
	for body, want := range map[string]pacing.Tokens{
		`{"messages":[{"content":"hello world"}],"max_tokens":10,"n":3}`: {Input: 2 + perMessage, Output: 30},
		`{"messages":[{"content":"hello world"}],"n":4}`:                 {Input: 2 + perMessage, Output: 400},
		`{"messages":[{"content":"hello world"}],"n":1}`:                 {Input: 2 + perMessage, Output: 100},
		`{"messages":[{"content":"hello world"}],"n":null}`:              {Input: 2 + perMessage, Output: 100},
		`{"prompt":"hello world","max_tokens":0,"n":5}`:                  {Input: 2},
		`{"prompt":"hello world","n":100000000}`:                         {Output: slots.MaxUnits}, // no more than an admission may weigh
	} {
		got, err := e.estimate([]byte(body), "m", false)
		require.NoError(t, err)
		assert.Equal(t, want, got, body)
	}
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

// A self-hosted server whose cache holds 20,000 tokens, behind the gateway
// with the same max_inflight_tokens: 8 prompts of about 15,000 tokens among
// 120 small ones, all sent at once, streaming. The server is never asked to
// hold more than its cache (it would answer 429), every request is served,
// and the large prompts are not starved by the small ones.
func TestGatewayKeepsASelfHostedServerUnderItsCache(t *testing.T) {
	underTheCache(t, 1, "")
}

// The same through three gateways of a fleet, on each store: the cap on
// tokens in flight is the fleet's (weighed leases), so the server still
// never holds more than its cache; three gateways each capping alone
// would let it be asked for up to three times as much.
func TestGatewayFleetKeepsASelfHostedServerUnderItsCache(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) { underTheCache(t, 3, `, "fleet": {`+store(t)+`, "timeout_ms": 2000}`) })
	}
}

// underTheCache sends the requests of the tests above through gateways
// gateways configured alike, with fleet added to their config.
func underTheCache(t *testing.T, gateways int, fleet string) {
	const cache = 20000
	up := simulated.New(1000)
	require.NoError(t, up.SetTokenLimit(cache))
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	var urls []string
	for range gateways {
		srv, _ := startGatewayWith(t, upSrv.URL, `{
			"upstream": "%s",
			"orgs": {"default_limit": 1000},
			"tokens": {"expected_output": 1024},
			"provider": {"max_inflight_tokens": `+fmt.Sprint(cache)+`, "max_queue": 1000, "max_queue_wait_ms": 60000}`+fleet+`
		}`)
		urls = append(urls, srv.URL)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)

	send := func(url, content string) (int, error) {
		body, err := json.Marshal(map[string]any{"model": "glm-5", "stream": true, "turn_ms": 30, "max_tokens": 100,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		if err != nil {
			return 0, err
		}
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, err
	}
	large, small := strings.Repeat("hello world ", 7500), strings.Repeat("hello world ", 10)
	var wg sync.WaitGroup
	var ok, failed atomic.Int32
	start := time.Now()
	for i := range 128 {
		content := small
		if i%16 == 0 {
			content = large
		}
		wg.Go(func() {
			if status, err := send(urls[i%gateways], content); err == nil && status == http.StatusOK {
				ok.Add(1)
			} else {
				failed.Add(1)
				t.Errorf("a request ended with %d, %v", status, err)
			}
		})
	}
	wg.Wait()
	c := up.Counts()
	assert.Equal(t, int32(128), ok.Load(), "every request served")
	assert.Zero(t, c.Refused, "the server never answered 429")
	assert.LessOrEqual(t, c.TokenPeak, int64(cache), "never asked to hold more than its cache")
	assert.Zero(t, c.Tokens)
	t.Logf("%d gateway(s): 128 requests (8 of about 15,000 tokens) in %v; the server's token peak %d of %d, %d requests at once at most",
		gateways, time.Since(start).Round(time.Millisecond), c.TokenPeak, cache, c.Peak)
}

// An embeddings request weighs its input's tokens, and no answer: it has
// none to take. Before, its "input" was not counted and it was weighed as
// the expected answer alone (100 here), whatever its size: one of 6000
// tokens went past a cap of 1000, and every one held 100 tokens of output
// budget it never used.
func TestGatewayWeighsEmbeddingsByTheirInput(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, tokensConfig)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	send := func(input any) *http.Response {
		body, err := json.Marshal(map[string]any{"model": "e", "input": input})
		require.NoError(t, err)
		resp, err := client.Post(srv.URL+"/v1/embeddings", "application/json", strings.NewReader(string(body)))
		require.NoError(t, err)
		return resp
	}
	resp := send([]string{"hello world", "hello world"})
	defer resp.Body.Close()
	waitFor(t, "the request is upstream", func() bool { return u.get(u.cur, "all") == 1 })
	assert.Equal(t, 2+2, gw.gate.Status().Tokens, "its input's tokens, and no answer")

	big := send(strings.Repeat("hello world ", 3000))
	defer big.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, big.StatusCode)
	assert.Equal(t, "tokens", big.Header.Get(CapHeader))
	assert.Equal(t, 1, u.get(u.peak, "all"), "the upstream never saw it")

	close(u.gate)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitFor(t, "its tokens are freed", func() bool { return gw.gate.Status().Tokens == 0 })
}
