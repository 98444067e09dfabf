package upstream

import (
	"errors"
	"fmt"

	"github.com/inflight-go/inflight/internal/badfield"
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
	if t.Input < 0 || t.Output < 0 || t.Total() < 0 { // a negative part, or a sum past MaxInt
		return fmt.Errorf("%w: input %d, output %d (want neither negative, a total of 1 to %d)",
			core.ErrBadUnits, t.Input, t.Output, core.MaxUnits)
	}
	return core.CheckUnits(t.Total())
}

// CheckCharge is Check for what a budget is charged, where a request
// whose tokens nobody counted (zero Tokens) is valid: it charges the
// budget's requests and none of its tokens.
func (t Tokens) CheckCharge() error {
	if t == (Tokens{}) {
		return nil
	}
	return t.Check()
}

// BudgetLimits are budgets per minute: TokensPerMinute counts a request's
// tokens in all, InputTokensPerMinute and OutputTokensPerMinute its
// prompt's and its answer's apart, for a provider that counts them so,
// and MaxRequestsPerMinute the requests themselves (each counts 1,
// whatever its tokens): at most that many start in any minute, in bursts
// if they come so (a pacing Config's requests_per_minute spaces them
// evenly instead). 0 leaves one out.
type BudgetLimits struct {
	TokensPerMinute       int `json:"tokens_per_minute,omitempty"`
	InputTokensPerMinute  int `json:"input_tokens_per_minute,omitempty"`
	OutputTokensPerMinute int `json:"output_tokens_per_minute,omitempty"`
	MaxRequestsPerMinute  int `json:"max_requests_per_minute,omitempty"`
}

// BudgetParts is how many parts a budget has: all tokens, input, output,
// requests (see BudgetCap).
const BudgetParts = 4

// Parts returns l indexed as BudgetCap names its parts.
func (l BudgetLimits) Parts() [BudgetParts]int {
	return [BudgetParts]int{l.TokensPerMinute, l.InputTokensPerMinute, l.OutputTokensPerMinute, l.MaxRequestsPerMinute}
}

// Charge returns what a request estimated to cost t charges each part of
// a budget, indexed as BudgetCap names them: its tokens in all, its input,
// its output, and 1 for the request.
func Charge(t Tokens) [BudgetParts]int64 {
	return [BudgetParts]int64{int64(t.Input) + int64(t.Output), int64(t.Input), int64(t.Output), 1}
}

// CheckBudgets returns the error of a negative budget in l, naming it by its
// JSON path after prefix ("" at the top of a configuration, `models["glm-5"].`
// in a model's section); nil when l is valid. (A method would be promoted to
// every configuration section that embeds BudgetLimits.)
func CheckBudgets(prefix string, l BudgetLimits) error {
	for i, n := range l.Parts() {
		if n < 0 {
			return badfield.Error(prefix+budgetCaps[i], n, "is negative")
		}
	}
	return nil
}

// ErrOverBudget: a budget per minute (of tokens or of requests) cannot
// take the request within its wait, or now; the refusal's RetryAfter is
// when it will have refilled enough.
var ErrOverBudget = errors.New("pacing: over budget")

// The budgets a refusal names in its slots.LimitError.Cap; a pacing
// Gate's model's are these with "model_" before them.
const (
	CapTokensPerMinute       = "tokens_per_minute"
	CapInputTokensPerMinute  = "input_tokens_per_minute"
	CapOutputTokensPerMinute = "output_tokens_per_minute"
	CapMaxRequestsPerMinute  = "max_requests_per_minute"
)

var budgetCaps = [BudgetParts]string{CapTokensPerMinute, CapInputTokensPerMinute, CapOutputTokensPerMinute, CapMaxRequestsPerMinute}

// BudgetCap names a budget's part as refusals do: 0 all tokens
// (CapTokensPerMinute), 1 input, 2 output, 3 requests
// (CapMaxRequestsPerMinute); "" for another part.
func BudgetCap(part int) string {
	if part < 0 || part >= len(budgetCaps) {
		return ""
	}
	return budgetCaps[part]
}
