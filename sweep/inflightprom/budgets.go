package inflightprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inflight-go/inflight/pacing"
)

// Budgets is a prometheus.Collector of budgets per minute (pacing's and a
// fleet's), read at each scrape: inflight_budget_tokens_left and
// inflight_budget_tokens_limit labelled cap and budget (tokens_per_minute,
// input_tokens_per_minute, output_tokens_per_minute), and
// inflight_budget_requests_left and inflight_budget_requests_limit
// labelled cap (max_requests_per_minute). Create it with NewBudgets.
type Budgets struct {
	read                                                 func() []Budget
	tokensLeft, tokensLimit, requestsLeft, requestsLimit *prometheus.Desc
}

var _ prometheus.Collector = (*Budgets)(nil)

// Budget is one budget as Budgets exports it: Cap says whose it is, named
// as a gateway names its caps ("provider", "model:<name>",
// "api_key:<id>", "tenant"), Budget which one (a pacing.BudgetCap name),
// Left what is left of it over the last minute (below 0 in debt) and
// Limit its limit.
type Budget struct {
	Cap, Budget string
	Left, Limit int
}

// NewBudgets returns a Collector of the budgets read returns at each
// scrape. Of two budgets with the same Cap and Budget, the later counts.
// A nil read exports none.
func NewBudgets(read func() []Budget) *Budgets {
	desc := func(m, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("inflight", "budget", m), help, labels, nil)
	}
	return &Budgets{
		read:          read,
		tokensLeft:    desc("tokens_left", "Tokens left of a budget over the last minute (negative in debt), by cap and budget.", "cap", "budget"),
		tokensLimit:   desc("tokens_limit", "A token budget per minute, by cap and budget.", "cap", "budget"),
		requestsLeft:  desc("requests_left", "Requests left of a budget of requests per minute (max_requests_per_minute) over the last minute, by cap.", "cap"),
		requestsLimit: desc("requests_limit", "A budget of requests per minute (max_requests_per_minute), by cap.", "cap"),
	}
}

// GateBudgets returns the budgets of g (Gate.Budgets) as Budgets exports
// them: the provider's under cap "provider", a model's under
// "model:<name>", an API key's under "api_key:<id>".
func GateBudgets(g *pacing.Gate) []Budget {
	st := g.Budgets()
	out := make([]Budget, 0, len(st))
	for _, b := range st {
		c := "provider"
		switch {
		case b.Model != "":
			c = "model:" + b.Model
		case b.Key != "":
			c = "api_key:" + b.Key
		}
		out = append(out, Budget{Cap: c, Budget: b.Cap, Left: b.Left, Limit: b.Limit})
	}
	return out
}

// Describe implements prometheus.Collector.
func (c *Budgets) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.tokensLeft, c.tokensLimit, c.requestsLeft, c.requestsLimit} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Budgets) Collect(ch chan<- prometheus.Metric) {
	type id struct{ cap, budget string }
	if c.read == nil {
		return // a scrape's goroutine is no place to panic
	}
	latest := map[id]Budget{}
	var order []id
	for _, b := range c.read() {
		k := id{b.Cap, b.Budget}
		if _, seen := latest[k]; !seen {
			order = append(order, k)
		}
		latest[k] = b
	}
	for _, k := range order {
		b := latest[k]
		if b.Budget == pacing.CapMaxRequestsPerMinute {
			ch <- constMetric(c.requestsLeft, prometheus.GaugeValue, float64(b.Left), b.Cap)
			ch <- constMetric(c.requestsLimit, prometheus.GaugeValue, float64(b.Limit), b.Cap)
			continue
		}
		ch <- constMetric(c.tokensLeft, prometheus.GaugeValue, float64(b.Left), b.Cap, b.Budget)
		ch <- constMetric(c.tokensLimit, prometheus.GaugeValue, float64(b.Limit), b.Cap, b.Budget)
	}
}
