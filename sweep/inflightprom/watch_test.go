package inflightprom_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// A Collector that watches a registry or a Limiter (and observes it) does
// not keep it alive once the program drops it, and then reports nothing
// of it.
func TestWatchedSourceDropped(t *testing.T) {
	for _, kind := range []string{"registry", "limiter"} {
		t.Run(kind, func(t *testing.T) {
			c := inflightprom.New("tenant")
			collected := make(chan struct{})
			// The source is read while it is in use: kept alive until the
			// read is done (it is unreachable once the func returns, and a
			// collection then, before the read, would find it gone).
			func() {
				if kind == "limiter" {
					l := slots.NewLimiter(1, slots.WithObserver(c))
					inflightprom.WatchLimiter(c, l)
					runtime.AddCleanup(l, func(ch chan struct{}) { close(ch) }, collected)
					assert.Equal(t, 1, testutil.CollectAndCount(c, "inflight_in_flight"), "read while in use")
					runtime.KeepAlive(l)
					return
				}
				r := registry.New[string](1, slots.WithObserver(c))
				inflightprom.WatchRegistry(c, r)
				runtime.AddCleanup(r, func(ch chan struct{}) { close(ch) }, collected)
				assert.Equal(t, 1, testutil.CollectAndCount(c, "inflight_in_flight"), "read while in use")
				runtime.KeepAlive(r)
			}()
			require.Eventually(t, func() bool {
				runtime.GC()
				select {
				case <-collected:
					return true
				default:
					return false
				}
			}, 10*time.Second, time.Millisecond, "the source collected")
			assert.Equal(t, 0, testutil.CollectAndCount(c, "inflight_in_flight"), "nothing read of a source gone")
			assert.Equal(t, 0, testutil.CollectAndCount(c, "inflight_acquired_total"))
		})
	}
}
