package upstream

import (
	"errors"
	"fmt"

	"github.com/inflight-go/inflight/internal/core"
)

// Tokens is what a request spends: its prompt's tokens (Input) and its
// answer's (Output). Before it is sent it is an estimate (the prompt
// counted, and the most it may answer); the usage the upstream reports
// corrects it.
type Tokens struct {
	Input  int
	Output int
}

// Total is Input + Output.
func (t Tokens) Total() int { return t.Input + t.Output }

// Check returns the error of a cost no admission can take: a negative
// part, or a total outside 1..slots.MaxUnits (both wrap
// slots.ErrBadUnits); nil else.
func (t Tokens) Check() error {
	if t.Input < 0 || t.Output < 0 {
		return core.CheckUnits(-1)
	}
	return core.CheckUnits(t.Total())
}

// BudgetLimits are token budgets per minute: TokensPerMinute counts a
// request's tokens in all, InputTokensPerMinute and OutputTokensPerMinute
// its prompt's and its answer's apart, for a provider that counts them so.
// 0 leaves one out.
type BudgetLimits struct {
	TokensPerMinute       int `json:"tokens_per_minute,omitempty"`
	InputTokensPerMinute  int `json:"input_tokens_per_minute,omitempty"`
	OutputTokensPerMinute int `json:"output_tokens_per_minute,omitempty"`
}

// CheckBudgets returns the error of a negative budget in l, naming it by its
// JSON path after prefix ("" at the top of a configuration, `models["glm-5"].`
// in a model's section); nil when l is valid. (A method would be promoted to
// every configuration section that embeds BudgetLimits.)
func CheckBudgets(prefix string, l BudgetLimits) error {
	for i, n := range [3]int{l.TokensPerMinute, l.InputTokensPerMinute, l.OutputTokensPerMinute} {
		if n < 0 {
			return fmt.Errorf("pacing: %s%s: %d is negative", prefix, budgetCaps[i], n)
		}
	}
	return nil
}

// ErrOverBudget: a token budget per minute cannot take the request within
// its wait, or now; the refusal's RetryAfter is when it will have refilled
// enough.
var ErrOverBudget = errors.New("pacing: over the token budget")

// The budgets a refusal names in its slots.LimitError.Cap; a pacing
// Gate's model's are these with "model_" before them.
const (
	CapTokensPerMinute       = "tokens_per_minute"
	CapInputTokensPerMinute  = "input_tokens_per_minute"
	CapOutputTokensPerMinute = "output_tokens_per_minute"
)

var budgetCaps = [3]string{CapTokensPerMinute, CapInputTokensPerMinute, CapOutputTokensPerMinute}

// BudgetCap names a budget's part as refusals do: 0 all tokens
// (CapTokensPerMinute), 1 input, 2 output; "" for another part.
func BudgetCap(part int) string {
	if part < 0 || part >= len(budgetCaps) {
		return ""
	}
	return budgetCaps[part]
}
