package pacing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// sseUpstream streams a short answer as OpenAI does, with the usage chunk
// only when the request asked for it (stream_options.include_usage), and
// with its Content-Length (as net/http sets it for a handler that ends
// before it flushes); asked records whether each request asked (under
// mu).
func sseUpstream(t *testing.T, mu *sync.Mutex, asked *[]bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		mu.Lock()
		*asked = append(*asked, body.StreamOptions.IncludeUsage)
		mu.Unlock()
		out := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
		if body.StreamOptions.IncludeUsage {
			out += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n"
		}
		out += "data: [DONE]\n\n"
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		fmt.Fprint(w, out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// With WithStreamUsage, a streamed request admitted under WithTokens that
// did not ask for its usage is sent asking, its budget is settled with the
// usage reported, and its client gets the whole stream without the usage
// chunk; a client that asked gets its chunk; a request without WithTokens
// is sent as it came. Without the option, the estimate stands.
func TestTransportStreamUsage(t *testing.T) {
	var mu sync.Mutex
	var asked []bool
	up := sseUpstream(t, &mu, &asked)
	sentAsking := func() []bool { mu.Lock(); defer mu.Unlock(); return slices.Clone(asked) }
	send := func(client *http.Client, weighed bool, body string, opts ...func(context.Context) context.Context) (string, int64) {
		ctx := pacing.WithModelName(context.Background(), "m")
		if weighed {
			ctx = pacing.WithTokens(ctx, pacing.Tokens{Input: 10, Output: 100})
		}
		for _, o := range opts {
			ctx = o(ctx)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		if resp.ContentLength < 0 {
			assert.Empty(t, resp.Header.Get("Content-Length"), "no length that no longer holds")
		}
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err, "the whole stream, no unexpected EOF")
		return string(got), resp.ContentLength
	}
	left := func(g *pacing.Gate) int { return providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left }
	cfg := pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}}
	g := newGate(t, cfg)
	client := &http.Client{Transport: pacing.NewTransport(up.Client().Transport, g, pacing.WithStreamUsage())}

	got, length := send(client, true, `{"model":"m","stream":true}`)
	assert.Equal(t, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n", got, "no usage chunk: the client did not ask")
	assert.Equal(t, int64(-1), length, "the upstream's length no longer holds")
	assert.Equal(t, []bool{true}, sentAsking(), "sent asking for it")
	assert.Equal(t, 1000-9, left(g), "settled with the 7 + 2 reported, not the estimate of 110")

	got, _ = send(client, true, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`)
	assert.Contains(t, got, `"usage":{"prompt_tokens":7`, "the client asked: its chunk is its own")
	assert.Equal(t, 1000-18, left(g))

	send(client, false, `{"model":"m","stream":true}`)
	assert.Equal(t, []bool{true, true, false}, sentAsking(), "not weighed: sent as it came")

	got, _ = send(client, true, `{"model":"m","stream":true}`, slots.WithoutSlot)
	assert.NotContains(t, got, `"usage"`, "without a slot: asked, and kept from the client all the same")

	g = newGate(t, cfg)
	plain := &http.Client{Transport: pacing.NewTransport(up.Client().Transport, g)}
	send(plain, true, `{"model":"m","stream":true}`)
	assert.Equal(t, 1000-110, left(g), "without the option, no usage: the estimate stands")
}

// An event stream may end its lines with "\n", "\r\n" or a lone "\r":
// under WithStreamUsage each event reaches the client as it comes (not
// held back waiting for a line end that never comes), the usage chunk is
// kept from the client who did not ask, and the budget is settled with
// the usage reported.
func TestTransportStreamUsageLineEnds(t *testing.T) {
	for name, le := range map[string]string{"LF": "\n", "CRLF": "\r\n", "CR": "\r"} {
		t.Run(name, func(t *testing.T) {
			first := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}" + le + le
			done := "data: [DONE]" + le + le
			next := make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, first)
				w.(http.Flusher).Flush()
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
				fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}"+le+le+done)
			}))
			t.Cleanup(up.Close)
			g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
			client := &http.Client{Transport: pacing.NewTransport(up.Client().Transport, g, pacing.WithStreamUsage())}
			ctx, cancel := context.WithTimeout(pacing.WithTokens(pacing.WithModelName(t.Context(), "m"), pacing.Tokens{Input: 10, Output: 100}), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, strings.NewReader(`{"model":"m","stream":true}`))
			require.NoError(t, err)
			resp, err := client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			got := make([]byte, len(first))
			_, err = io.ReadFull(resp.Body, got)
			require.NoError(t, err, "the first event, before the upstream sends more")
			assert.Equal(t, first, string(got))
			close(next)
			rest, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, done, string(rest), "no usage chunk: the client did not ask")
			assert.Equal(t, 1000-9, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left, "settled with the 7 + 2 reported")
		})
	}
}
