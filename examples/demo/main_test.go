package main

import (
	"strings"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the default workload on a fake clock: the direct run meets
// 429s, the run through the registry meets none and completes everything.
func TestDemo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out strings.Builder
		require.NoError(t, run(nil, &out))
		d, c := lastOutcome.direct, lastOutcome.capped
		assert.Positive(t, d.refused, "the provider refuses some direct requests")
		assert.Less(t, d.completed, d.requests)
		assert.Zero(t, c.refused)
		assert.Equal(t, c.requests, c.completed)
		assert.LessOrEqual(t, c.peak, int64(5), "never more than the account allows")
		assert.Contains(t, out.String(), "through inflight")
	})
}

func TestDemoFlags(t *testing.T) {
	err := run([]string{"-account-limit", "0"}, &strings.Builder{})
	var usage usageError
	assert.ErrorAs(t, err, &usage)
	assert.ErrorAs(t, run([]string{"-nope"}, &strings.Builder{}), &usage)
}
