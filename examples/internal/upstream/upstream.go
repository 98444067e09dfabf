// Package upstream is the simulated model provider of the example programs:
// it streams chat completions as server-sent events for as long as each
// request asks, and, like providers with concurrency-limited plans, answers
// 429 (code 1302) once more requests are open than its limit, and in its
// token mode once they hold more tokens than a self-hosted server's cache
// (SetTokenLimit). Hidden serves
// pacing/pacingtest's provider instead, whose cap is hidden and moves, for
// the learned cap.
package upstream

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// MaxTurnMS bounds the turn a request asks for.
const MaxTurnMS = 10 * 60 * 1000

// DefaultTurnMS is the turn of a request that does not ask for one.
const DefaultTurnMS = 1000

// Provider is the simulated upstream. A request's JSON body may carry
// "turn_ms", how long its answer streams (a token every 20 ms). Create it
// with New.
type Provider struct {
	limit    int64
	inFlight atomic.Int64
	peak     atomic.Int64
	refused  atomic.Int64
	served   atomic.Int64

	// The token mode (SetTokenLimit): the tokens in flight and their cap.
	tokenLimit atomic.Int64 // 0: tokens are not counted against a cap
	tokens     atomic.Int64
	tokenPeak  atomic.Int64

	minute minuteLog // the budget mode (SetTokensPerMinute)
}

// New returns a Provider that allows limit requests open at once.
func New(limit int) *Provider { return &Provider{limit: int64(limit)} }

// Counts is what a Provider has seen. Peak counts every request open at
// once, the refused ones too: that is the burst the account sees.
type Counts struct {
	InFlight, Peak, Refused, Served int64
	// Tokens and TokenPeak are the tokens of the requests open now and at
	// most, in the token mode (the refused ones too, as Peak counts them).
	Tokens, TokenPeak int64
}

// Counts returns the counts now.
func (p *Provider) Counts() Counts {
	return Counts{InFlight: p.inFlight.Load(), Peak: p.peak.Load(), Refused: p.refused.Load(), Served: p.served.Load(),
		Tokens: p.tokens.Load(), TokenPeak: p.tokenPeak.Load()}
}

// DefaultMaxTokens is the answer a request reserves in the token mode when
// its body sets no max_tokens.
const DefaultMaxTokens = 1024

// SetTokenLimit turns the token mode on (n > 0) or off: like a self-hosted
// server that reserves its KV cache per request, the provider then also
// answers 429 once the requests open hold more than n tokens, a request
// holding its prompt's (its messages' text, counted with o200k_base) and
// its max_tokens or max_completion_tokens (DefaultMaxTokens without
// either). Call it before serving.
func (p *Provider) SetTokenLimit(n int64) error {
	if _, err := codec(); n > 0 && err != nil {
		return err
	}
	p.tokenLimit.Store(n)
	return nil
}

// tokensOf is what a request holds in the token mode.
func (p *Provider) tokensOf(messages []message, maxTokens *int) int64 {
	n := int64(DefaultMaxTokens)
	if maxTokens != nil {
		n = int64(max(*maxTokens, 0))
	}
	return n + p.promptOf(messages)
}

// message is a chat message: its content a string, or a list of parts
// (strings, or objects whose "text" is counted).
type message struct {
	Content json.RawMessage `json:"content"`
}

// texts are a message's text: its content's, or each of its parts'.
func (m message) texts() []string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []string{s}
	}
	var parts []json.RawMessage
	_ = json.Unmarshal(m.Content, &parts)
	var texts []string
	for _, part := range parts {
		var text struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(part, &s) == nil {
			text.Text = s
		} else {
			_ = json.Unmarshal(part, &text)
		}
		texts = append(texts, text.Text)
	}
	return texts
}

// promptOf counts a request's prompt: its messages' text, as a gateway
// would estimate it (o200k_base, and 4 tokens a message beside its text).
func (p *Provider) promptOf(messages []message) int64 {
	c, err := codec()
	if err != nil {
		return 0
	}
	var n int64
	for _, m := range messages {
		for _, text := range m.texts() {
			k, _ := c.Count(text)
			n += int64(k)
		}
		n += 4
	}
	return n
}

// ResetCounts starts the refusals afresh, and the peaks from what is open
// now, between runs.
func (p *Provider) ResetCounts() {
	p.peak.Store(0)
	raise(&p.peak, p.inFlight.Load()) // after the store: an arrival meanwhile raises it too
	p.refused.Store(0)
	p.served.Store(0)
	p.tokenPeak.Store(0)
	raise(&p.tokenPeak, p.tokens.Load())
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"glm-5","object":"model"},{"id":"glm-4-air","object":"model"}]}`+"\n")
		return
	}
	req := struct {
		Model               string    `json:"model"`
		TurnMS              *int      `json:"turn_ms"`
		Messages            []message `json:"messages"`
		MaxTokens           *int      `json:"max_tokens"`
		MaxCompletionTokens *int      `json:"max_completion_tokens"` // max_tokens' newer name
		StreamOptions       struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}{}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if m := req.MaxCompletionTokens; m != nil && (req.MaxTokens == nil || *m < *req.MaxTokens) {
		req.MaxTokens = m // the tighter bounds the answer
	}
	n := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	raise(&p.peak, n)
	overTokens := false
	if limit := p.tokenLimit.Load(); limit > 0 {
		k := p.tokensOf(req.Messages, req.MaxTokens)
		t := p.tokens.Add(k)
		defer p.tokens.Add(-k)
		raise(&p.tokenPeak, t)
		overTokens = t > limit
	}
	prompt := p.promptOf(req.Messages)
	var started *tokenStart // in the budget mode: this request's tokens in its minute
	overBudget := false
	if n <= p.limit && !overTokens {
		started, overBudget = p.minute.start(prompt)
	}
	if n > p.limit || overTokens || overBudget {
		p.refused.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`)
		return
	}
	turnMS := DefaultTurnMS
	if req.TurnMS != nil {
		turnMS = min(max(*req.TurnMS, 0), MaxTurnMS) // a time.Duration must not overflow
	}
	w.Header().Set("Content-Type", "text/event-stream")
	deadline := time.Now().Add(time.Duration(turnMS) * time.Millisecond)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var out int64 // the answer's tokens, one a chunk
	for time.Now().Before(deadline) && (req.MaxTokens == nil || out < int64(*req.MaxTokens)) {
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n")
		w.(http.Flusher).Flush()
		out++
		p.minute.add(started, 1) // the minute counts the answer as it streams
		select {
		case <-tick.C:
		case <-r.Context().Done():
			return
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\n", prompt, out)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	p.served.Add(1)
}

// raise makes peak at least n.
func raise(peak *atomic.Int64, n int64) {
	for pk := peak.Load(); n > pk && !peak.CompareAndSwap(pk, n); pk = peak.Load() {
	}
}
