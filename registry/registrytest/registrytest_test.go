package registrytest_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/registrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a TB that records failures instead of failing.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestVerify(t *testing.T) {
	reg := registry.New[string](2)
	var rec recorder
	registrytest.Verify(&rec, reg)
	assert.Empty(t, rec.errs, "an idle registry passes")

	s, err := reg.TryAcquire("org-a/glm-5")
	require.NoError(t, err)
	registrytest.Verify(&rec, reg)
	require.Len(t, rec.errs, 1, "a held slot fails the check")
	assert.Contains(t, rec.errs[0], "tracks 1 keys: 1 held, 0 waiting")
	assert.Contains(t, rec.errs[0], fmt.Sprintf("key org-a/glm-5: slot %d held for", s.ID()))
	s.Release()

	rec.errs = nil
	s, _ = reg.TryAcquire("late")
	go s.Release() // a straggler: released by another goroutine
	registrytest.Verify(&rec, reg)
	assert.Empty(t, rec.errs, "the check waits for a release on its way")
}

// printingTB stands in for a *testing.T in the example.
type printingTB struct{}

func (printingTB) Helper()                           {}
func (printingTB) Errorf(format string, args ...any) { fmt.Println("FAIL") }

func ExampleVerify() {
	reg := registry.New[string](8)
	s, _ := reg.TryAcquire("org-a")
	s.Release()
	registrytest.Verify(printingTB{}, reg) // in a test: defer registrytest.Verify(t, reg)
	fmt.Println("nothing left held")
	// Output: nothing left held
}
