package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// watch reads body through WatchUsage in chunks of size bytes (all of it,
// or only cut bytes before closing when cut > 0) and returns the reports.
func watch(t *testing.T, body, contentType string, size, cut int) []pacing.Tokens {
	t.Helper()
	var got []pacing.Tokens
	rc := pacing.WatchUsage(io.NopCloser(strings.NewReader(body)), contentType, func(u pacing.Tokens) { got = append(got, u) })
	buf := make([]byte, size)
	read := 0
	for cut == 0 || read < cut {
		n, err := rc.Read(buf[:min(size, max(cut-read, 1))])
		read += n
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	require.NoError(t, rc.Close())
	return got
}

const (
	openAIJSON = `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`
	// A stream asked with stream_options.include_usage: its last chunk
	// carries the usage and no choices.
	openAIStream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	anthropicStream = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n" +
		"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"the usage is\"}}\r\n\r\n" +
		"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n" +
		"event: message_stop\r\ndata: {\"type\":\"message_stop\"}"
)

func TestWatchUsage(t *testing.T) {
	for _, tc := range []struct {
		name, body, ct string
		want           []pacing.Tokens
	}{
		{"openai json", openAIJSON, "application/json", []pacing.Tokens{{Input: 12, Output: 34}}},
		{"anthropic json", `{"content":[],"usage":{"input_tokens":3,"output_tokens":4}}`, "application/json; charset=utf-8", []pacing.Tokens{{Input: 3, Output: 4}}},
		{"responses api", `{"response":{"usage":{"input_tokens":5,"output_tokens":6}}}`, "application/json", []pacing.Tokens{{Input: 5, Output: 6}}},
		{"no usage", `{"choices":[]}`, "application/json", nil},
		{"not json", `usage`, "text/plain", nil},
		{"openai stream", openAIStream, "text/event-stream", []pacing.Tokens{{Input: 7, Output: 2}}},
		{"anthropic stream", anthropicStream, "text/event-stream; charset=utf-8", []pacing.Tokens{{Input: 25, Output: 15}}},
		{"stream without usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", "text/event-stream", nil},
		{"negative counts", `{"usage":{"prompt_tokens":-5,"completion_tokens":3}}`, "application/json", []pacing.Tokens{{Input: 0, Output: 3}}},
		// The answer's own usage, not one in its content or deeper in it.
		{"usage first, pretty", "{\n  \"usage\" : {\n \"prompt_tokens\": 2, \"completion_tokens\": 3 },\n  \"choices\": [ ]\n}\n", "application/json", []pacing.Tokens{{Input: 2, Output: 3}}},
		{"usage in a string", `{"choices":[{"message":{"content":"say \"usage\":{\"prompt_tokens\":99} \\"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, "application/json", []pacing.Tokens{{Input: 1, Output: 2}}},
		{"usage deeper", `{"choices":[{"usage":{"prompt_tokens":9}}],"data":{"x":{"usage":{"prompt_tokens":8}}}}`, "application/json", nil},
		{"usage as a value", `{"object":"usage","usage":null,"data":{"usage":"x"}}`, "application/json", nil},
		{"escaped key", `{"us\u0061ge":{"prompt_tokens":1,"completion_tokens":1}}`, "application/json", nil},
		{"message a string", `{"message":"hi","usage":{"input_tokens":4,"output_tokens":5}}`, "application/json", []pacing.Tokens{{Input: 4, Output: 5}}},
		{"message's usage", `{"message":{"id":"m","usage":{"input_tokens":6,"output_tokens":7}}}`, "application/json", []pacing.Tokens{{Input: 6, Output: 7}}},
		{"last of a key twice", `{"usage":{"prompt_tokens":1,"completion_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":2}}`, "application/json", []pacing.Tokens{{Input: 2, Output: 2}}},
		{"an array", `[{"usage":{"prompt_tokens":1,"completion_tokens":1}}]`, "application/json", nil},
		{"closed too often", `{"a":1}}{"usage":{"prompt_tokens":1,"completion_tokens":1}}`, "application/json", nil},
		{"cut", `{"usage":{"prompt_tokens":1,"completion_tokens":1}`, "application/json", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// However the body is cut into reads, the same report, once.
			for _, size := range []int{1, 2, 7, 64, 4096} {
				assert.Equal(t, tc.want, watch(t, tc.body, tc.ct, size, 0), "reads of %d bytes", size)
			}
		})
	}
}

// A body closed before its end reports nothing, unless a stream's usage
// (its output count) had come: the estimate stands for a client that
// walked away.
func TestWatchUsageClosedEarly(t *testing.T) {
	assert.Empty(t, watch(t, openAIJSON, "application/json", 8, len(openAIJSON)-1))
	usageEnd := strings.Index(openAIStream, "data: [DONE]")
	assert.Empty(t, watch(t, openAIStream, "text/event-stream", 8, usageEnd-10))
	assert.Equal(t, []pacing.Tokens{{Input: 7, Output: 2}}, watch(t, openAIStream, "text/event-stream", 8, usageEnd))
	msgStart := strings.Index(anthropicStream, "event: content_block_delta")
	assert.Empty(t, watch(t, anthropicStream, "text/event-stream", 8, msgStart), "the input alone is not the usage")
}

// A JSON answer over MaxUsageBody passes through whole, and its usage is
// read all the same (it was not, when the answer was kept to be read at
// its end); a line of a stream over it passes through unread, and the
// lines after it are read.
func TestWatchUsageBounds(t *testing.T) {
	big := `{"pad":"` + strings.Repeat("x", 3*pacing.MaxUsageBody) + `","usage":{"prompt_tokens":1,"completion_tokens":1}}`
	var got []pacing.Tokens
	rc := pacing.WatchUsage(io.NopCloser(strings.NewReader(big)), "application/json", func(u pacing.Tokens) { got = append(got, u) })
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.Equal(t, big, string(b))
	assert.Equal(t, []pacing.Tokens{{Input: 1, Output: 1}}, got)
	over := `{"usage":{"prompt_tokens":1,"pad":"` + strings.Repeat("x", pacing.MaxUsageBody) + `"}}`
	assert.Empty(t, watch(t, over, "application/json", 4096, 0), "a usage object over MaxUsageBody is not read")

	long := "data: {\"pad\":\"" + strings.Repeat("y", pacing.MaxUsageBody) + "\",\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":9}}\n\n" +
		"data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n"
	assert.Equal(t, []pacing.Tokens{{Input: 1, Output: 2}}, watch(t, long, "text/event-stream", 4096, 0))
	require.NoError(t, iotest.TestReader(pacing.WatchUsage(io.NopCloser(strings.NewReader(openAIStream)), "text/event-stream", func(pacing.Tokens) {}), []byte(openAIStream)))
}

// A Transport that admits a request under WithTokens settles its budget
// with the usage its answer reports: a real server streaming SSE, read to
// its end.
func TestTransportSettlesUsage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, openAIStream)
	}))
	defer srv.Close()
	g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 10_000, InputTokensPerMinute: 5000}})
	client := &http.Client{Transport: pacing.NewTransport(srv.Client().Transport, g)}
	send := func(ctx context.Context) {
		req, err := http.NewRequestWithContext(pacing.WithModelName(ctx, "m"), http.MethodPost, srv.URL, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
	var settled []pacing.Settlement
	send(pacing.WithTrace(pacing.WithTokens(context.Background(), pacing.Tokens{Input: 100, Output: 900}),
		&pacing.Trace{Settled: func(st pacing.Settlement) { settled = append(settled, st) }}))
	assert.Equal(t, []pacing.Settlement{{Served: true, Used: pacing.Tokens{Input: 7, Output: 2}}}, settled, "the trace hears it too")
	st := g.Status()
	assert.Equal(t, 10_000-9, providerBudget(t, st, pacing.CapTokensPerMinute).Left, "settled with the 7 + 2 reported")
	assert.Equal(t, 5000-7, providerBudget(t, st, pacing.CapInputTokensPerMinute).Left)
	assert.Zero(t, st.InFlight)

	send(context.Background()) // not weighed: one token, and nothing settled
	assert.Equal(t, 10_000-10, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left)
}

// An Anthropic stream that ends after its message_start without a
// message_delta (an error event mid-stream, as its overloaded_error, then
// the stream's clean end) never said what its answer used: as when it is
// closed early, its estimate stands. Before, it reported the input with
// the message_start's output of 1, which is not the answer's: the output
// estimate was given back for an answer that had streamed.
func TestWatchUsageStreamEndedWithoutItsOutput(t *testing.T) {
	cut := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"the answer so far\"}}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	for _, size := range []int{1, 7, 4096} {
		assert.Empty(t, watch(t, cut, "text/event-stream", size, 0), "reads of %d bytes", size)
	}
	// A JSON answer's input alone is its usage (an embedding's).
	assert.Equal(t, []pacing.Tokens{{Input: 8}}, watch(t, `{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}`, "application/json", 7, 0))
}

// Anthropic's input_tokens leaves out the prompt's tokens written to its
// cache (cache_creation_input_tokens), which its input tokens per minute
// count all the same (those read from the cache they do not): the input
// settled is both. Before, a prompt of 10 005 tokens written to the cache
// settled 5, and the 10 000 went back to the budget.
func TestWatchUsageCountsAnthropicCacheWrites(t *testing.T) {
	json := `{"type":"message","usage":{"input_tokens":5,"cache_creation_input_tokens":10000,"cache_read_input_tokens":4000,"output_tokens":7}}`
	assert.Equal(t, []pacing.Tokens{{Input: 10_005, Output: 7}}, watch(t, json, "application/json", 7, 0))
	stream := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":10000,\"cache_read_input_tokens\":4000,\"output_tokens\":1}}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	assert.Equal(t, []pacing.Tokens{{Input: 10_005, Output: 15}}, watch(t, stream, "text/event-stream", 7, 0))
	// OpenAI's prompt_tokens counts its cached tokens already.
	openai := `{"usage":{"prompt_tokens":100,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":90}}}`
	assert.Equal(t, []pacing.Tokens{{Input: 100, Output: 2}}, watch(t, openai, "application/json", 7, 0))
}
