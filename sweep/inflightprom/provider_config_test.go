package inflightprom_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// A Provider's caps are those of the Config it was made with: a caller
// that edits its Config's API keys in place afterwards (to build the next
// one for Gate.Reconfigure, say) changes neither a key's limit nor the
// pool's, which stays the sum of the keys' as the scrape shows them.
func TestProviderPoolLimitKeepsTheConfigItWasMadeWith(t *testing.T) {
	cfg := pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "a", MaxConcurrentRequests: 2}, {ID: "b", MaxConcurrentRequests: 3}}}
	gate, err := pacing.NewGate("p", cfg)
	require.NoError(t, err)
	defer gate.Close()
	p := inflightprom.NewProvider(gate, cfg)

	cfg.APIKeys[0].MaxConcurrentRequests = 10 // the caller's next config, not this Provider's

	a, ok := p.Snapshot("api_key:a")
	require.True(t, ok)
	pool, ok := p.Snapshot("api_keys")
	require.True(t, ok)
	assert.Equal(t, 2, a.Limit, "a key's limit is the Config's")
	assert.Equal(t, 5, pool.Limit, "the pool's limit is the sum of its keys' as exported")
}

// WithLearner(nil), like a nil option, leaves the Provider reading its
// learned limits from the Gate: a scrape does not call a nil Learner.
func TestProviderWithANilLearnerReadsTheGate(t *testing.T) {
	cfg := pacing.Config{MaxConcurrentRequests: 4, Models: map[string]pacing.ModelConfig{"m": {MaxConcurrentRequests: 2}}}
	gate, err := pacing.NewGate("p", cfg)
	require.NoError(t, err)
	defer gate.Close()
	p := inflightprom.NewProvider(gate, cfg, inflightprom.WithLearner(nil))
	require.NotPanics(t, func() {
		s, ok := p.Snapshot("provider")
		require.True(t, ok)
		assert.Equal(t, 4, s.Limit)
		s, ok = p.Snapshot("model:m")
		require.True(t, ok)
		assert.Equal(t, 2, s.Limit)
	})
}
