package inflightotel_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// A Cap wired as its package says (the Observer of a registry that it
// watches, and of the registry's Monitor) keeps neither the registry alive
// nor its Monitor running once the program drops the registry, and then
// reports nothing of it; likewise for a Limiter.
func TestWatchedSourceDropped(t *testing.T) {
	for _, kind := range []string{"registry", "limiter"} {
		t.Run(kind, func(t *testing.T) {
			m := newMeters(t)
			c, err := inflightotel.New("tenant", inflightotel.WithMeterProvider(m))
			require.NoError(t, err)
			mock := clock.NewMock()
			collected := make(chan struct{})
			// The source is read while it is in use: kept alive until the
			// read is done (it is unreachable once the func returns, and a
			// collection then, before the read, would find it gone).
			mon := func() interface{ Done() <-chan struct{} } {
				if kind == "limiter" {
					l := slots.NewLimiter(1, slots.WithObserver(c))
					inflightotel.WatchLimiter(c, l)
					runtime.AddCleanup(l, func(ch chan struct{}) { close(ch) }, collected)
					mon := sweep.NewForLimiter(l, sweep.WithClock(mock), sweep.WithInterval(time.Second), sweep.WithObserver(c))
					assert.Contains(t, m.collect(t), "inflight.slot.active", "read while in use")
					runtime.KeepAlive(l)
					return mon
				}
				r := registry.New[string](1, slots.WithObserver(c))
				inflightotel.WatchRegistry(c, r)
				runtime.AddCleanup(r, func(ch chan struct{}) { close(ch) }, collected)
				s, err := r.TryAcquire("org-a")
				require.NoError(t, err)
				s.Release()
				mon := sweep.New(r, sweep.WithClock(mock), sweep.WithInterval(time.Second), sweep.WithObserver(c))
				assert.Contains(t, m.collect(t), "inflight.slot.active", "read while in use")
				runtime.KeepAlive(r)
				return mon
			}()
			require.Eventually(t, func() bool {
				runtime.GC()
				mock.Add(time.Second)
				select {
				case <-mon.Done():
					return true
				default:
					return false
				}
			}, 10*time.Second, time.Millisecond, "the Monitor ended with its source")
			require.Eventually(t, func() bool {
				runtime.GC()
				select {
				case <-collected:
					return true
				default:
					return false
				}
			}, 10*time.Second, time.Millisecond, "the source collected")
			assert.NotContains(t, m.collect(t), "inflight.slot.active", "nothing read of a source gone")
			require.NoError(t, c.Close())
		})
	}
}

// Watch with a nil function stops watching, as inflightprom's does: a
// collection then reads no source, as before the first Watch, rather than
// calling nil on the SDK's collecting goroutine.
func TestWatchNilStopsWatchingWithoutPanicking(t *testing.T) {
	m := newMeters(t)
	c, err := inflightotel.New("tenant", inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	inflightotel.Watch(c, func() inflightotel.Snapshot {
		return inflightotel.Snapshot{InFlight: 1, Waiting: 0, Keys: -1, Limit: 2}
	})
	assert.Contains(t, m.collect(t), "inflight.slot.active")
	inflightotel.Watch(c, nil)
	var got map[string]metricdata.Aggregation
	require.NotPanics(t, func() { got = m.collect(t) })
	assert.NotContains(t, got, "inflight.slot.active", "nothing watched")
}
