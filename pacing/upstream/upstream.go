// Package upstream holds what the pacing Gate and a fleet both say about an
// upstream provider: what its answers mean for its limits (Verdict, Kind),
// how a cap is learned from them (AdaptiveConfig, Learned), and what a
// request costs it (Tokens, BudgetLimits).
//
// Package pacing names each of these as its own (pacing.Verdict is
// upstream.Verdict) and classifies answers (pacing.Classify); package
// registry/fleet takes them without importing pacing. Most programs use the
// pacing names and need not import this package.
package upstream

import (
	"strconv"
	"time"

	"github.com/inflight-go/inflight/internal/learn"
)

// Kind is what an upstream's answer says about its limits.
type Kind uint8

const (
	// Other: an answer that says nothing about limits (a 400, a 500).
	Other = Kind(learn.KindOther)
	// Admitted: the upstream took the request (a 2xx or 3xx).
	Admitted = Kind(learn.KindAdmitted)
	// Concurrency: refused because too many requests were open at once.
	// It cuts a learned cap (Overload only lowers it a little).
	Concurrency = Kind(learn.KindConcurrency)
	// Rate: refused for requests or tokens per unit of time. It pauses new
	// starts for its Retry-After; the cap is left as it is.
	Rate = Kind(learn.KindRate)
	// Overload: the provider as a whole is busy (Anthropic's 529, a 503).
	// It pauses starts and lowers a learned cap a little.
	Overload = Kind(learn.KindOverload)
	// Quota: the account or key has used its allowance. With a key pool,
	// the key leaves the pool until its Retry-After (or pacing.QuotaPause).
	Quota = Kind(learn.KindQuota)
)

var kindNames = [...]string{"other", "admitted", "concurrency", "rate", "overload", "quota"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Verdict is a classified answer: its Kind and how long the upstream asked
// to wait (0: it did not say).
type Verdict struct {
	Kind       Kind
	RetryAfter time.Duration
}
