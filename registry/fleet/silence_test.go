package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// A process that holds nothing is heard by the store each renewal round
// (an empty renewal), so that a quiet fleet is not a silent store: a dead
// holder's lease expires a TTL after its last renewal while the only live
// process sends a short request every 0.7 TTL. If it were heard only
// through its requests, each would come after a silence of more than half
// the TTL, and hold the dead lease a TTL more, request after request
// (driver.Store). In virtual time.
func TestIdleProcessIsHeard(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		store := memstore.New()
		const ttl = 3 * time.Second
		dead := New[string](store, 1, WithLeaseTTL(ttl))
		_, err := dead.TryAcquire("k")
		require.NoError(t, err)
		dead.Close() // it dies holding k: no renewal, no release
		live := New[string](store, 1, WithLeaseTTL(ttl))
		defer live.Close()
		start := time.Now()
		var took time.Duration
		for range 20 {
			time.Sleep(7 * ttl / 10) // a quiet fleet: a request every 0.7 TTL
			if s, err := live.TryAcquire("k"); err == nil {
				took = time.Since(start)
				s.Release()
				break
			}
		}
		t.Logf("the dead holder's room taken %v after its lease", took)
		require.NotZero(t, took, "the dead holder's lease still held after %v", 20*7*ttl/10)
		assert.LessOrEqual(t, took, 2*ttl, "its lease expired about a TTL after its last renewal")
	})
}
