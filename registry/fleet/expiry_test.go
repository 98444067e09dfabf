package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Processes with different lease TTLs share keys (a rolling deploy that
// changes WithLeaseTTL): a key's own expiry covers its latest lease, so
// that the short TTL of one process, at its admission or its renewal, does
// not make the key expire with another's longer lease in it.
func TestKeyExpiryCoversTheLatestLease(t *testing.T) {
	for _, renewed := range []bool{false, true} {
		name := "after an admission"
		if renewed {
			name = "after a renewal"
		}
		t.Run(name, func(t *testing.T) {
			m := newMini(t)
			long := m.registry(2, WithLeaseTTL(time.Minute))
			short := m.registry(2, WithLeaseTTL(300*time.Millisecond))
			sl, err := long.TryAcquire("k")
			require.NoError(t, err)
			ss, err := short.TryAcquire("k")
			require.NoError(t, err)
			if renewed {
				require.True(t, short.renew())
			}
			ss.Release()
			eventually(t, "the short lease is removed", func() bool { return len(m.leases("k")) == 1 })
			m.Srv.FastForward(time.Second) // the keys' own expiries
			m.advance(time.Second)         // the scripts' clock
			assert.Len(t, m.leases("k"), 1, "the long lease is still in Redis")
			n, err := long.InFlight(t.Context(), "k")
			require.NoError(t, err)
			assert.Equal(t, 1, n)
			sl.Release()
		})
	}
}
