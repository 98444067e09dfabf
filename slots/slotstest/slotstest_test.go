package slotstest_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// recorder is a TB that records failures instead of failing.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestEventually: a check of one's own is retried until it reports
// nothing, and its last report fails the test otherwise.
func TestEventually(t *testing.T) {
	var rec recorder
	calls := 0
	slotstest.Eventually(&rec, func() string {
		if calls++; calls < 3 {
			return "not yet"
		}
		return ""
	})
	assert.Empty(t, rec.errs, "it passes once the check reports nothing")
	assert.Equal(t, 3, calls)

	slotstest.Eventually(&rec, func() string { return "still held" })
	assert.Equal(t, []string{"still held"}, rec.errs, "a check that never clears fails with its report")
}

func TestVerifyLimiter(t *testing.T) {
	lim := slots.NewLimiter(1)
	var rec recorder
	s, _ := lim.TryAcquire()
	slotstest.VerifyLimiter(&rec, lim)
	require.Len(t, rec.errs, 1)
	assert.Contains(t, rec.errs[0], "limiter has 1 held and 0 waiting")
	assert.Contains(t, rec.errs[0], fmt.Sprintf("slot %d held for", s.ID()))
	s.Release()
	rec.errs = nil
	slotstest.VerifyLimiter(&rec, lim)
	assert.Empty(t, rec.errs)
}
