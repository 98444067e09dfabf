package inflightprom_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// A Gate's budgets, with one of the program's own (a tenant's), each
// under its cap: token budgets by budget, budgets of requests apart; a
// later budget of the same cap and name replaces an earlier one.
func TestBudgetsMetrics(t *testing.T) {
	g := newGate(t, pacing.Config{
		BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10},
		Models:       map[string]pacing.ModelConfig{"glm-5": {BudgetLimits: pacing.BudgetLimits{OutputTokensPerMinute: 300}}},
		APIKeys:      []pacing.KeyConfig{{ID: "a", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 5}}},
	})
	gr, err := g.AcquireTokens(context.Background(), "glm-5", pacing.Tokens{Input: 100, Output: 200})
	require.NoError(t, err)
	defer gr.Slot.Release()
	c := inflightprom.NewBudgets(func() []inflightprom.Budget {
		return append(inflightprom.GateBudgets(g),
			inflightprom.Budget{Cap: "tenant", Budget: pacing.CapTokensPerMinute, Left: 1, Limit: 2},
			inflightprom.Budget{Cap: "tenant", Budget: pacing.CapTokensPerMinute, Left: -50, Limit: 100})
	})
	want := `
# HELP inflight_budget_requests_left Requests left of a budget of requests per minute (max_requests_per_minute) over the last minute, by cap.
# TYPE inflight_budget_requests_left gauge
inflight_budget_requests_left{cap="api_key:a"} 4
inflight_budget_requests_left{cap="provider"} 9
# HELP inflight_budget_requests_limit A budget of requests per minute (max_requests_per_minute), by cap.
# TYPE inflight_budget_requests_limit gauge
inflight_budget_requests_limit{cap="api_key:a"} 5
inflight_budget_requests_limit{cap="provider"} 10
# HELP inflight_budget_tokens_left Tokens left of a budget over the last minute (negative in debt), by cap and budget.
# TYPE inflight_budget_tokens_left gauge
inflight_budget_tokens_left{budget="output_tokens_per_minute",cap="model:glm-5"} 100
inflight_budget_tokens_left{budget="tokens_per_minute",cap="provider"} 700
inflight_budget_tokens_left{budget="tokens_per_minute",cap="tenant"} -50
# HELP inflight_budget_tokens_limit A token budget per minute, by cap and budget.
# TYPE inflight_budget_tokens_limit gauge
inflight_budget_tokens_limit{budget="output_tokens_per_minute",cap="model:glm-5"} 300
inflight_budget_tokens_limit{budget="tokens_per_minute",cap="provider"} 1000
inflight_budget_tokens_limit{budget="tokens_per_minute",cap="tenant"} 100
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want)))
}

// A nil source exports nothing, as a nil Watch does: the scrape's
// goroutine panicked, which ends the program.
func TestNilSourcesExportNothing(t *testing.T) {
	require.NotPanics(t, func() {
		require.Zero(t, testutil.CollectAndCount(inflightprom.NewBudgets(nil)))
		require.Zero(t, testutil.CollectAndCount(inflightprom.NewLearnedCaps("zai", nil)))
	})
}
