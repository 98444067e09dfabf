package upstream_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/examples/internal/upstream"
)

// serve runs one request with body through p in a goroutine of the
// bubble, its answer recorded; the returned channel is closed when the
// handler has returned.
func serve(ctx context.Context, p *upstream.Provider, body string) (*httptest.ResponseRecorder, <-chan struct{}) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.ServeHTTP(rec, req)
	}()
	return rec, done
}

// The budget mode counts an answer as far as it has streamed: a request
// whose prompt fits beside the prompts started in the minute but not
// beside the answer still streaming is refused.
func TestBudgetCountsAnAnswerWhileItStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := upstream.New(10)
		require.NoError(t, p.SetTokensPerMinute(100))
		// "hi": 1 token and 4 for its message; an answer of a token every
		// 20 ms for 1 s.
		_, first := serve(t.Context(), p, `{"turn_ms":1000,"messages":[{"content":"hi"}]}`)
		time.Sleep(900 * time.Millisecond)
		synctest.Wait() // 46 tokens streamed so far: 51 taken in the minute
		// 57 tokens and 4: 61, over the 49 left (but not the 95 the prompts leave).
		rec, second := serve(t.Context(), p, `{"turn_ms":20,"messages":[{"content":"`+strings.Repeat("hello world ", 28)+`"}]}`)
		<-second
		assert.Equal(t, http.StatusTooManyRequests, rec.Code, "5 + 46 streamed + 61 is over 100")
		assert.Equal(t, int64(1), p.Counts().Refused)
		<-first
		tokens, started := p.WorstMinute()
		assert.Equal(t, int64(5+50), tokens)
		assert.Equal(t, 1, started)
	})
}

// A request's weight in the token mode, and its usage: max_completion_tokens
// bounds the answer as max_tokens does, and a message's content given as a
// list of parts counts its text.
func TestTokensOfTheOtherRequestForms(t *testing.T) {
	for name, c := range map[string]struct {
		body           string
		held           int64
		prompt, answer int
	}{
		"max_tokens":            {`{"turn_ms":1000,"max_tokens":10,"messages":[{"content":"hello world"}]}`, 6 + 10, 6, 10},
		"max_completion_tokens": {`{"turn_ms":1000,"max_completion_tokens":10,"messages":[{"content":"hello world"}]}`, 6 + 10, 6, 10},
		"parts": {`{"turn_ms":1000,"max_tokens":10,"messages":[{"content":[{"type":"text","text":"hello world"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			6 + 10, 6, 10},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := upstream.New(10)
				require.NoError(t, p.SetTokenLimit(100))
				body := strings.Replace(c.body, `{"turn_ms"`, `{"stream_options":{"include_usage":true},"turn_ms"`, 1)
				rec, done := serve(t.Context(), p, body)
				synctest.Wait()
				assert.Equal(t, c.held, p.Counts().Tokens, "held while it streams")
				<-done
				assert.Equal(t, http.StatusOK, rec.Code)
				assert.Contains(t, rec.Body.String(), fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":%d}`, c.prompt, c.answer))
				assert.Zero(t, p.Counts().Tokens)
			})
		})
	}
}

// ResetCounts between runs starts the peaks afresh from what is open then:
// a request still open is in the next run's peak, which is never below
// what is in flight.
func TestResetCountsKeepsWhatIsOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := upstream.New(10)
		require.NoError(t, p.SetTokenLimit(1000))
		ctx, cancel := context.WithCancel(t.Context())
		_, done := serve(ctx, p, `{"turn_ms":60000,"max_tokens":100,"messages":[{"content":"hello world"}]}`)
		synctest.Wait()
		p.ResetCounts()
		c := p.Counts()
		assert.Equal(t, upstream.Counts{InFlight: 1, Peak: 1, Tokens: 106, TokenPeak: 106}, c)
		cancel()
		<-done
		assert.Equal(t, upstream.Counts{Peak: 1, TokenPeak: 106}, p.Counts())
	})
}
