package pgstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Revision 23 (budgetCheck) replaces inflight_budget under its
// signature, on a connection that kept the plans of revision 22's: this
// release's check charges nothing and tells when the cost fits, and a
// charge (as the releases before send it) is taken or refused as before.
func TestMigrateBudgetCheck(t *testing.T) {
	s := migratedStore(t, 22, `SELECT inflight_budget('f', 'k', false, false, 0, ARRAY[100, 0, 0]::bigint[], ARRAY[60, 60, 0]::bigint[])`)
	ctx := context.Background()
	call := func(cost int64, check bool) driver.BudgetResult {
		t.Helper()
		res, err := s.Budget(ctx, &driver.BudgetCall{Key: "k", Limits: [3]int64{100}, Cost: [3]int64{cost, cost}, Check: check})
		require.NoError(t, err)
		return res
	}
	require.True(t, call(60, false).Charged)
	res := call(50, true)
	assert.False(t, res.Charged)
	assert.Greater(t, res.At, res.Now, "50 more does not fit")
	assert.Equal(t, [3]int64{60, 60, 0}, res.Used)
	refused := call(50, false)
	assert.False(t, refused.Charged)
	assert.Equal(t, res.At, refused.At, "as the charge's refusal")
	res = call(40, true)
	assert.False(t, res.Charged, "a check charges nothing")
	assert.Zero(t, res.At, "40 fits now")
	assert.Equal(t, [3]int64{100, 100, 0}, call(40, false).Used, "nothing was charged but the charges")
}
