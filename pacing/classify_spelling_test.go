package pacing_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/pacing"
)

// DefaultClassifier reads the waits of a header map built by hand (a base
// RoundTripper's literal) in any spelling, as it reads the allowances at 0
// there: it took a spent allowance in lower case for a Rate, but not its
// reset nor Retry-After beside it, so the pause was the 1 s default.
func TestDefaultClassifierWaitsInAnySpelling(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"a reset", http.Header{"x-ratelimit-remaining-requests": {"0"}, "x-ratelimit-reset-requests": {"7s"}}, 7 * time.Second},
		{"Anthropic's reset", http.Header{"anthropic-ratelimit-requests-remaining": {"0"},
			"anthropic-ratelimit-requests-reset": {time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}, 59 * time.Minute},
		{"Retry-After", http.Header{"retry-after": {"7"}}, 7 * time.Second},
		{"Retry-After-Ms", http.Header{"retry-after-ms": {"7000"}, "Retry-After": {"1"}}, 7 * time.Second},
	} {
		v := pacing.DefaultClassifier(http.StatusTooManyRequests, tc.h, nil)
		assert.GreaterOrEqual(t, v.RetryAfter, tc.want, "%s: %v", tc.name, tc.h)
		assert.LessOrEqual(t, v.RetryAfter, max(tc.want, time.Hour), "%s: %v", tc.name, tc.h)
	}
}
