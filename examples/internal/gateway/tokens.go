package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tiktoken-go/tokenizer"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// DefaultExpectedOutput is the answer a request is expected to take, in
// tokens, when neither its max_tokens nor the config says less.
const DefaultExpectedOutput = 1024

// TokensConfig is how a request's tokens are estimated for the provider's
// max_inflight_tokens caps and its token budgets per minute: its prompt
// counted by a tokenizer (o200k_base, embedded in the binary: nothing is
// downloaded), plus the answer it may take, min(max_tokens, the model's
// expected output). The budgets are then corrected with the usage the
// upstream reports.
type TokensConfig struct {
	// ExpectedOutput is the answer expected of a request that does not
	// bound it lower with max_tokens (or max_completion_tokens); 0 means
	// DefaultExpectedOutput.
	ExpectedOutput int `json:"expected_output,omitempty"`
	// Models sets ExpectedOutput per model.
	Models map[string]int `json:"models,omitempty"`
}

func (c *TokensConfig) check() error {
	if c.ExpectedOutput < 0 {
		return fmt.Errorf("tokens.expected_output: %d is negative", c.ExpectedOutput)
	}
	for m, n := range c.Models {
		if n < 0 {
			return fmt.Errorf("tokens.models[%q]: %d is negative", m, n)
		}
	}
	return nil
}

// estimator counts a request's tokens; a Gateway has one only when the
// provider caps tokens.
type estimator struct {
	codec    tokenizer.Codec
	expected int
	models   map[string]int
}

// newEstimator returns the estimator for cfg (nil: the defaults).
func newEstimator(cfg *TokensConfig) (*estimator, error) {
	codec, err := tokenizer.Get(tokenizer.O200kBase)
	if err != nil {
		return nil, err
	}
	e := &estimator{codec: codec, expected: DefaultExpectedOutput}
	if cfg != nil {
		if cfg.ExpectedOutput > 0 {
			e.expected = cfg.ExpectedOutput
		}
		e.models = cfg.Models
	}
	return e, nil
}

// capsTokens reports whether the provider's policy caps or budgets tokens
// anywhere.
func capsTokens(p pacing.Config) bool { return capsInflightTokens(p) || budgetsTokens(p) }

// capsInflightTokens reports whether the provider's policy caps tokens in
// flight, for the provider or a model.
func capsInflightTokens(p pacing.Config) bool {
	if p.MaxInflightTokens > 0 {
		return true
	}
	for _, m := range p.Models {
		if m.MaxInflightTokens > 0 {
			return true
		}
	}
	return false
}

// registerTokens exports the tokens in flight under the provider's token
// caps and their limits: inflight_tokens and inflight_token_limit, told
// apart by the label cap ("provider", "model:<name>" for each model the
// config caps), as the request caps' series are. The tokens are this
// gateway's; with a fleet the limit is the fleet's, and the fleet's
// tokens in flight are the sum over its gateways.
func (g *Gateway) registerTokens(cfg Config) {
	tokens := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inflight_tokens",
		Help: "Estimated tokens of the requests in flight (prompt and the answer they may take), by cap."}, []string{"cap"})
	limits := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inflight_token_limit",
		Help: "The cap on tokens in flight (max_inflight_tokens), by cap."}, []string{"cap"})
	g.metrics.MustRegister(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		st := g.gate.Status()
		if n := cfg.Provider.MaxInflightTokens; n > 0 {
			tokens.WithLabelValues("provider").Set(float64(st.Tokens))
			limits.WithLabelValues("provider").Set(float64(n))
		}
		for name, m := range cfg.Provider.Models {
			if m.MaxInflightTokens > 0 {
				tokens.WithLabelValues("model:" + name).Set(float64(st.TokensByModel[name]))
				limits.WithLabelValues("model:" + name).Set(float64(m.MaxInflightTokens))
			}
		}
		tokens.Collect(ch)
		limits.Collect(ch)
	}))
}

// perMessage is what each chat message adds beside its text (its role and
// separators), as OpenAI's chat format counts it.
const perMessage = 4

// estimate returns the tokens of a request for model whose JSON body is
// body: the prompt's (the chat messages' text, a completion's prompt, an
// embedding's input) and the answer it may take (none for an embedding).
// A body whose messages cannot be read is a *slots.BadRequestError.
func (e *estimator) estimate(body []byte, model string, embedding bool) (pacing.Tokens, error) {
	var v struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Prompt              json.RawMessage `json:"prompt"`
		Input               json.RawMessage `json:"input"`
		MaxTokens           *int            `json:"max_tokens"`
		MaxCompletionTokens *int            `json:"max_completion_tokens"`
		N                   *int            `json:"n"` // choices: each an answer
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return pacing.Tokens{}, &slots.BadRequestError{Reason: "messages: " + err.Error()}
	}
	n := 0
	for _, m := range v.Messages {
		k, err := e.count(m.Content)
		if err != nil {
			return pacing.Tokens{}, err
		}
		n += k + perMessage
	}
	if embedding { // its input, and no answer
		k, err := e.count(v.Input)
		if err != nil {
			return pacing.Tokens{}, err
		}
		return pacing.Tokens{Input: min(max(n+k, 1), slots.MaxUnits)}, nil
	}
	k, err := e.count(v.Prompt)
	if err != nil {
		return pacing.Tokens{}, err
	}
	n += k
	out := e.expected
	if o, ok := e.models[model]; ok && o > 0 {
		out = o
	}
	for _, limit := range []*int{v.MaxTokens, v.MaxCompletionTokens} {
		if limit != nil && *limit >= 0 {
			out = min(out, *limit)
		}
	}
	out = min(out, slots.MaxUnits)
	if v.N != nil && *v.N > 1 { // n choices: as many answers
		if out > slots.MaxUnits / *v.N {
			out = slots.MaxUnits
		} else {
			out *= *v.N
		}
	}
	// At least one token, and no more than an admission may weigh.
	return pacing.Tokens{Input: min(max(n, 1-out), slots.MaxUnits-out), Output: out}, nil
}

var errContent = &slots.BadRequestError{Status: http.StatusBadRequest, Reason: "content: want a string or a list of parts"}

// count returns the tokens of a message's content, a prompt or an
// embedding's input: a string, a list of strings, or a list of parts
// whose "text" is counted (images and other parts count nothing here); a
// completion's prompt and an embedding's input may also be token ids (a
// list of numbers, or of lists of them), one token each.
func (e *estimator) count(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return e.codec.Count(s)
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, errContent
	}
	n := 0
	for _, p := range parts {
		var text struct {
			Text string `json:"text"`
		}
		var ids []float64
		switch {
		case json.Unmarshal(p, &s) == nil:
			text.Text = s
		case json.Unmarshal(p, new(float64)) == nil: // a token id
			n++
			continue
		case json.Unmarshal(p, &ids) == nil: // a prompt of token ids
			n += len(ids)
			continue
		case json.Unmarshal(p, &text) != nil:
			return 0, errContent
		}
		k, err := e.codec.Count(text.Text)
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}
