package upstream_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/slots"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAdaptiveConfigCheck(t *testing.T) {
	cases := []struct {
		name       string
		a          upstream.AdaptiveConfig
		configured int
		err        string // "" for valid
	}{
		{"empty is valid: every field has a default", upstream.AdaptiveConfig{}, 0, ""},
		{"a negative floor", upstream.AdaptiveConfig{Min: -1}, 0, "pacing: models.m.adaptive.min: -1 is negative"},
		{"a negative ceiling", upstream.AdaptiveConfig{Max: -1}, 0, "pacing: models.m.adaptive.max: -1 is negative"},
		{"a negative start", upstream.AdaptiveConfig{Initial: -2}, 0, "pacing: models.m.adaptive.initial: -2 is negative"},
		{"a retest over a day", upstream.AdaptiveConfig{RetestMS: upstream.MaxMS + 1}, 0, "pacing: models.m.adaptive.retest_ms: 86400001 is outside [0, 86400000]"},
		{"a floor over the configured cap", upstream.AdaptiveConfig{Min: 9}, 8, "pacing: models.m.adaptive.min: 9 is over the ceiling 8"},
		{"a floor under it", upstream.AdaptiveConfig{Min: 8}, 8, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.a.Check("models.m.adaptive", c.configured)
			if c.err == "" {
				assert.NoError(t, err)
				assert.NoError(t, c.a.Validate(c.configured))
				return
			}
			assert.EqualError(t, err, c.err)
			assert.Error(t, c.a.Validate(c.configured), "Validate names the section adaptive")
		})
	}
}

func TestAdaptiveConfigBounds(t *testing.T) {
	lo, hi := upstream.AdaptiveConfig{}.Bounds(0)
	assert.Equal(t, [2]int{upstream.DefaultAdaptiveMin, upstream.DefaultAdaptiveMax}, [2]int{lo, hi}, "the defaults")
	lo, hi = upstream.AdaptiveConfig{}.Bounds(20)
	assert.Equal(t, [2]int{1, 20}, [2]int{lo, hi}, "a configured cap is the ceiling")
	lo, hi = upstream.AdaptiveConfig{Min: 2, Max: 50}.Bounds(20)
	assert.Equal(t, [2]int{2, 20}, [2]int{lo, hi}, "and stays one under a higher Max")
}

func TestCheckBudgets(t *testing.T) {
	assert.NoError(t, upstream.CheckBudgets("", upstream.BudgetLimits{}))
	assert.NoError(t, upstream.CheckBudgets("", upstream.BudgetLimits{TokensPerMinute: 1000, OutputTokensPerMinute: 10}))
	assert.EqualError(t, upstream.CheckBudgets("", upstream.BudgetLimits{InputTokensPerMinute: -1}), "pacing: input_tokens_per_minute: -1 is negative")
	assert.EqualError(t, upstream.CheckBudgets(`models["m"].`, upstream.BudgetLimits{OutputTokensPerMinute: -5}),
		`pacing: models["m"].output_tokens_per_minute: -5 is negative`)
}

func TestTokensCheck(t *testing.T) {
	assert.NoError(t, upstream.Tokens{Input: 10}.Check())
	assert.NoError(t, upstream.Tokens{Output: 1}.Check())
	assert.NoError(t, upstream.Tokens{}.CheckCharge(), "a charge of no tokens counted: the request alone")
	assert.ErrorIs(t, upstream.Tokens{Input: -1}.CheckCharge(), slots.ErrBadUnits)
	assert.Equal(t, [upstream.BudgetParts]int64{7, 3, 4, 1}, upstream.Charge(upstream.Tokens{Input: 3, Output: 4}))
	for _, bad := range []upstream.Tokens{{}, {Input: -1, Output: 5}, {Input: slots.MaxUnits, Output: 1}} {
		assert.ErrorIs(t, bad.Check(), slots.ErrBadUnits, "%+v", bad)
	}
}

// TestTokensCheckNamesTheParts: a cost with a negative part, or whose
// parts overflow when summed, is refused naming the parts it was given,
// not a weight of -1 (or a wrapped sum) that the caller never passed.
func TestTokensCheckNamesTheParts(t *testing.T) {
	err := upstream.Tokens{Input: -50, Output: 60}.Check()
	assert.ErrorIs(t, err, slots.ErrBadUnits)
	assert.EqualError(t, err, "slots: units out of range: input -50, output 60 (want neither negative, a total of 1 to 2147483647)")
	huge := upstream.Tokens{Input: math.MaxInt, Output: math.MaxInt}
	assert.ErrorIs(t, huge.Check(), slots.ErrBadUnits)
	assert.Contains(t, huge.Check().Error(), fmt.Sprintf("input %d, output %d", math.MaxInt, math.MaxInt))
	assert.EqualError(t, upstream.Tokens{Input: 0, Output: 0}.Check(), "slots: units out of range: 0 (want 1 to 2147483647)")
}

func TestNames(t *testing.T) {
	assert.Equal(t, "tokens_per_minute", upstream.BudgetCap(0))
	assert.Equal(t, "input_tokens_per_minute", upstream.BudgetCap(1))
	assert.Equal(t, "output_tokens_per_minute", upstream.BudgetCap(2))
	assert.Equal(t, "max_requests_per_minute", upstream.BudgetCap(3))
	assert.Empty(t, upstream.BudgetCap(4))
	assert.Empty(t, upstream.BudgetCap(-1))
	assert.Equal(t, "concurrency", upstream.Concurrency.String())
	assert.Equal(t, "kind(9)", upstream.Kind(9).String())
	assert.True(t, errors.Is(fmt.Errorf("refused: %w", upstream.ErrOverBudget), upstream.ErrOverBudget))
}

func ExampleAdaptiveConfig_Check() {
	a := upstream.AdaptiveConfig{Min: 12}
	fmt.Println(a.Check("models.glm-5.adaptive", 8))
	lo, hi := upstream.AdaptiveConfig{}.Bounds(8)
	fmt.Println(lo, hi)
	// Output:
	// pacing: models.glm-5.adaptive.min: 12 is over the ceiling 8
	// 1 8
}
