package slotstest_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// recorder is a TB that records failures instead of failing.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestVerifyRegistry(t *testing.T) {
	reg := registry.New[string](2)
	var rec recorder
	slotstest.VerifyRegistry(&rec, reg)
	assert.Empty(t, rec.errs, "an idle registry passes")

	s, err := reg.TryAcquire("org-a/glm-5")
	require.NoError(t, err)
	slotstest.VerifyRegistry(&rec, reg)
	require.Len(t, rec.errs, 1, "a held slot fails the check")
	assert.Contains(t, rec.errs[0], "tracks 1 keys: 1 held, 0 waiting")
	assert.Contains(t, rec.errs[0], fmt.Sprintf("key org-a/glm-5: slot %d held for", s.ID()))
	s.Release()

	rec.errs = nil
	s, _ = reg.TryAcquire("late")
	go s.Release() // a straggler: released by another goroutine
	slotstest.VerifyRegistry(&rec, reg)
	assert.Empty(t, rec.errs, "the check waits for a release on its way")
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
