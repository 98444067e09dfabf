package pacing

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// WithRateLimitHeaders makes a Transport tell each answer's client what
// the Gate's budgets per minute have left, as OpenAI's API does
// (SetRateLimitHeaders, from Gate.Budgets, for the request's model and
// granted key), in place of the upstream's own: every x-ratelimit-*
// header of the upstream's goes (its numbers are one key's, or count
// what the Gate does not), unless the Gate has no budget to tell. An
// answer that is not a 2xx and carries x-ratelimit-* headers of the
// upstream's keeps them as they came, and gets none of the Gate's: they
// say why the upstream refused and when to come back (a 429 with a
// requests allowance at 0 and its reset), which the Gate's numbers would
// contradict. The answer is classified from the upstream's headers either
// way (see ClassifyAsRead).
func WithRateLimitHeaders() TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.rateLimitHeaders = true })
}

// SetAnswerRateLimitHeaders sets on resp, the answer to a request for
// model sent with key, the rate-limit headers of budgets as
// SetRateLimitHeaders does, in place of the upstream's, unless it is an
// upstream's refusal that has its own (see WithRateLimitHeaders): for a
// proxy that counts budgets of its own beside the Gate's.
func SetAnswerRateLimitHeaders(resp *http.Response, budgets []BudgetStatus, model, key string) {
	if resp.Header == nil {
		resp.Header = make(http.Header) // a base's answer without one
	}
	var upstream []string
	for name := range resp.Header {
		if len(name) >= len(rateLimitPrefix) && strings.EqualFold(name[:len(rateLimitPrefix)], rateLimitPrefix) {
			upstream = append(upstream, name)
		}
	}
	tight := tightest(budgets, model, key)
	if len(upstream) > 0 && (resp.StatusCode/100 != 2 || tight == [2]*BudgetStatus{}) {
		return
	}
	for _, name := range upstream {
		delete(resp.Header, name)
	}
	setRateLimits(resp.Header, tight)
}

const rateLimitPrefix = "X-Ratelimit-"

// SetRateLimitHeaders sets OpenAI's x-ratelimit-limit-tokens,
// x-ratelimit-remaining-tokens and x-ratelimit-reset-tokens (a duration,
// as "1m0.5s") from the token budget with the least left of those in
// budgets that a request for model sent with the API key key counts on
// (the provider's, its model's, its key's: a Gate's Budgets), if any, and
// x-ratelimit-*-requests so from the budgets of requests
// (CapMaxRequestsPerMinute). Remaining is never below 0; a budget with
// nothing counted has no reset (one h had is removed).
func SetRateLimitHeaders(h http.Header, budgets []BudgetStatus, model, key string) {
	setRateLimits(h, tightest(budgets, model, key))
}

// tightest returns the token budget and the requests budget with the
// least left of those in budgets that a request for model sent with key
// counts on; nil for a kind it has none of.
func tightest(budgets []BudgetStatus, model, key string) [2]*BudgetStatus {
	var tight [2]*BudgetStatus // tokens, requests
	for i, b := range budgets {
		mine := (b.Model == "" || b.Model == model) && (b.Key == "" || b.Key == key)
		kind := 0
		if b.Cap == CapMaxRequestsPerMinute {
			kind = 1
		}
		if mine && (tight[kind] == nil || b.Left < tight[kind].Left) {
			tight[kind] = &budgets[i]
		}
	}
	return tight
}

// setRateLimits sets the headers of tight on h (see SetRateLimitHeaders).
func setRateLimits(h http.Header, tight [2]*BudgetStatus) {
	for kind, suffix := range [2]string{"-Tokens", "-Requests"} {
		b := tight[kind]
		if b == nil {
			continue
		}
		for name := range h { // a map built by hand may spell them otherwise
			if c := http.CanonicalHeaderKey(name); c != name && strings.HasPrefix(c, rateLimitPrefix) && strings.HasSuffix(c, suffix) {
				delete(h, name)
			}
		}
		h.Set("X-Ratelimit-Limit"+suffix, strconv.Itoa(b.Limit))
		h.Set("X-Ratelimit-Remaining"+suffix, strconv.Itoa(max(b.Left, 0)))
		if b.ResetIn > 0 {
			h.Set("X-Ratelimit-Reset"+suffix, b.ResetIn.Round(time.Millisecond).String())
		} else {
			h.Del("X-Ratelimit-Reset" + suffix)
		}
	}
}
