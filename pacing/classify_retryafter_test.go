package pacing_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/pacing"
)

// Retry-After-Ms is read before Retry-After only when it asks for a wait:
// 0, a negative number or NaN falls back to Retry-After (it hid a valid
// one). A number too large for a float asks for the most, 24 h, as a large
// one does (it was read as none).
func TestRetryAfterHeadersOddValues(t *testing.T) {
	for _, tc := range []struct {
		ms, ra, reset string
		want          time.Duration
	}{
		{"0", "7", "", 7 * time.Second},
		{"-5", "3", "", 3 * time.Second},
		{"NaN", "2", "", 2 * time.Second},
		{"1500", "7", "", 1500 * time.Millisecond},
		{"", "1e400", "", 24 * time.Hour},
		{"1e400", "", "", 24 * time.Hour},
		{"", "1e300", "", 24 * time.Hour},
		{"", "", "1e400", 24 * time.Hour},
	} {
		h := http.Header{}
		for k, v := range map[string]string{"Retry-After-Ms": tc.ms, "Retry-After": tc.ra, "X-Ratelimit-Reset-Requests": tc.reset} {
			if v != "" {
				h.Set(k, v)
			}
		}
		if tc.reset != "" {
			h.Set("X-Ratelimit-Remaining-Requests", "0")
		}
		v := pacing.DefaultClassifier(http.StatusTooManyRequests, h, nil)
		assert.Equal(t, tc.want, v.RetryAfter, "%v", h)
	}
}

// A Retry-After-Ms too small to be a wait (under a nanosecond) falls back
// to Retry-After too.
func TestRetryAfterMsBelowANanosecond(t *testing.T) {
	for _, ms := range []string{"1e-7", "0.0000009"} {
		h := http.Header{"Retry-After-Ms": {ms}, "Retry-After": {"30"}}
		assert.Equal(t, 30*time.Second, pacing.DefaultClassifier(http.StatusTooManyRequests, h, nil).RetryAfter, ms)
	}
}
