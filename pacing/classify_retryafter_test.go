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

// The headers' numbers are decimal (an exponent allowed): what else
// strconv reads (Inf, hex floats and their underscores) is not a wait, and
// a header of one falls back as an unreadable one does (Inf was a wait of
// 24 h, 0x1p4 one of 16 s). A reset that is a duration past Go's range
// (about 290 years) asks for the most, as a large number does (it read as
// none).
func TestRetryAfterHeadersOnlyDecimal(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        time.Duration
	}{
		{"Retry-After-Ms", "Inf", 7 * time.Second},
		{"Retry-After-Ms", "+Infinity", 7 * time.Second},
		{"Retry-After-Ms", "0x1p12", 7 * time.Second},
		{"Retry-After", "Inf", 0},
		{"Retry-After", "0x_1p4", 0},
		{"Retry-After", "0x10", 0},
		{"Retry-After", "+2.5", 2500 * time.Millisecond},
		{"X-Ratelimit-Reset-Tokens", "3000000h", 24 * time.Hour},
		{"X-Ratelimit-Reset-Tokens", "2h30m", 2*time.Hour + 30*time.Minute},
		{"X-Ratelimit-Reset-Tokens", "0x1p4", 0},
		{"X-Ratelimit-Reset-Tokens", "Inf", 0},
	} {
		h := http.Header{tc.name: {tc.value}}
		switch tc.name {
		case "Retry-After-Ms":
			h.Set("Retry-After", "7")
		case "X-Ratelimit-Reset-Tokens":
			h.Set("X-Ratelimit-Remaining-Tokens", "0")
		}
		assert.Equal(t, tc.want, pacing.DefaultClassifier(http.StatusTooManyRequests, h, nil).RetryAfter, "%s: %s", tc.name, tc.value)
	}
}
