package inflightprom_test

import (
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

func TestRegistryMetrics(t *testing.T) {
	mock := clock.NewMock()
	c := inflightprom.New("tenant")
	reg := registry.New[string](1, slots.WithObserver(c), slots.WithClock(mock))
	inflightprom.WatchRegistry(c, reg)

	a, err := reg.TryAcquire("org-a")
	require.NoError(t, err)
	_, err = reg.TryAcquire("org-a")
	require.Error(t, err)
	b, err := reg.TryAcquire("org-b")
	require.NoError(t, err)
	_, err = reg.TryAcquireN("org-c", 2)
	require.ErrorIs(t, err, slots.ErrExceedsLimit)
	mock.Add(3 * time.Second)
	b.Release()
	b.Release()

	const want = `
# HELP inflight_acquired_total Admissions that took capacity.
# TYPE inflight_acquired_total counter
inflight_acquired_total{cap="tenant"} 2
# HELP inflight_double_releases_total Release calls on a slot already released.
# TYPE inflight_double_releases_total counter
inflight_double_releases_total{cap="tenant"} 1
# HELP inflight_in_flight Units held now (one per slot unless weighted); a slot held under several keys counts under each.
# TYPE inflight_in_flight gauge
inflight_in_flight{cap="tenant"} 1
# HELP inflight_keys Keys tracked now: with a holder or a waiter.
# TYPE inflight_keys gauge
inflight_keys{cap="tenant"} 1
# HELP inflight_rejected_total Rejections, by reason.
# TYPE inflight_rejected_total counter
inflight_rejected_total{cap="tenant",reason="canceled"} 0
inflight_rejected_total{cap="tenant",reason="exceeds_limit"} 1
inflight_rejected_total{cap="tenant",reason="invalid_key"} 0
inflight_rejected_total{cap="tenant",reason="limit_reached"} 1
inflight_rejected_total{cap="tenant",reason="queue_full"} 0
inflight_rejected_total{cap="tenant",reason="wait_timeout"} 0
# HELP inflight_released_total Capacity given back.
# TYPE inflight_released_total counter
inflight_released_total{cap="tenant"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"inflight_acquired_total", "inflight_double_releases_total", "inflight_in_flight",
		"inflight_keys", "inflight_rejected_total", "inflight_released_total"))

	hold := `
# HELP inflight_hold_seconds How long slots were held.
# TYPE inflight_hold_seconds histogram
inflight_hold_seconds_bucket{cap="tenant",le="0.05"} 0
inflight_hold_seconds_bucket{cap="tenant",le="0.1"} 0
inflight_hold_seconds_bucket{cap="tenant",le="0.2"} 0
inflight_hold_seconds_bucket{cap="tenant",le="0.4"} 0
inflight_hold_seconds_bucket{cap="tenant",le="0.8"} 0
inflight_hold_seconds_bucket{cap="tenant",le="1.6"} 0
inflight_hold_seconds_bucket{cap="tenant",le="3.2"} 1
inflight_hold_seconds_bucket{cap="tenant",le="6.4"} 1
inflight_hold_seconds_bucket{cap="tenant",le="12.8"} 1
inflight_hold_seconds_bucket{cap="tenant",le="25.6"} 1
inflight_hold_seconds_bucket{cap="tenant",le="51.2"} 1
inflight_hold_seconds_bucket{cap="tenant",le="102.4"} 1
inflight_hold_seconds_bucket{cap="tenant",le="204.8"} 1
inflight_hold_seconds_bucket{cap="tenant",le="409.6"} 1
inflight_hold_seconds_bucket{cap="tenant",le="819.2"} 1
inflight_hold_seconds_bucket{cap="tenant",le="1638.4"} 1
inflight_hold_seconds_bucket{cap="tenant",le="+Inf"} 1
inflight_hold_seconds_sum{cap="tenant"} 3
inflight_hold_seconds_count{cap="tenant"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(hold), "inflight_hold_seconds"))
	a.Release()
	assert.Equal(t, 2, testutil.CollectAndCount(c, "inflight_wait_seconds", "inflight_hold_seconds"))
}

func TestLimiterMetrics(t *testing.T) {
	c := inflightprom.New("upstream")
	assert.Equal(t, 0, testutil.CollectAndCount(c), "before Watch and before any observation: nothing")
	lim := slots.NewLimiter(8, slots.WithObserver(c), slots.WithLeakDetection(), slots.WithLogger(slog.New(slog.DiscardHandler)))
	inflightprom.WatchLimiter(c, lim)
	s, _ := lim.TryAcquire()
	assert.Equal(t, 8.0, testutil.ToFloat64(collectorFor(c, "inflight_limit")))
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(c, "inflight_in_flight")))
	s.Release()
	_, err := lim.TryAcquireN(9)
	require.ErrorIs(t, err, slots.ErrExceedsLimit)
	func() { _, _ = lim.TryAcquire() }() // dropped while held
	// Stats count the leak as it is found; its event comes once it is freed.
	for i := 0; testutil.ToFloat64(collectorFor(c, "inflight_leaked_total")) == 0 && i < 1000; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(c, "inflight_leaked_total")), "a slot dropped while held")
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inflight_rejected_total Rejections, by reason.
# TYPE inflight_rejected_total counter
inflight_rejected_total{cap="upstream",reason="canceled"} 0
inflight_rejected_total{cap="upstream",reason="exceeds_limit"} 1
inflight_rejected_total{cap="upstream",reason="limit_reached"} 0
inflight_rejected_total{cap="upstream",reason="queue_full"} 0
inflight_rejected_total{cap="upstream",reason="wait_timeout"} 0
`), "inflight_rejected_total"))
	assert.Zero(t, testutil.CollectAndCount(c, "inflight_keys"), "a limiter has no keys gauge")
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
	runtime.KeepAlive(lim) // watched weakly: a Limiter gone reports nothing
}

func TestCapsShareFamilies(t *testing.T) {
	reg := prometheus.NewRegistry()
	tenants := inflightprom.New("tenant")
	tenantsReg := registry.New[string](4)
	defer runtime.KeepAlive(tenantsReg) // watched weakly
	inflightprom.WatchRegistry(tenants, tenantsReg)
	provider := inflightprom.New("provider")
	inflightprom.Watch(provider, func() inflightprom.Snapshot {
		return inflightprom.Snapshot{InFlight: 5, Waiting: 8, Keys: -1, Limit: 5,
			Counts: &inflightprom.Counts{Acquired: 9, Rejected: map[string]uint64{"queue_full": 2}}}
	})
	model := inflightprom.New("model:glm-5")
	inflightprom.Watch(model, func() inflightprom.Snapshot {
		return inflightprom.Snapshot{InFlight: 2, Waiting: -1, Keys: -1, Limit: slots.Unlimited}
	})
	provider.ObserveWait(1500 * time.Millisecond)
	reg.MustRegister(tenants, provider, model)

	const want = `
# HELP inflight_in_flight Units held now (one per slot unless weighted); a slot held under several keys counts under each.
# TYPE inflight_in_flight gauge
inflight_in_flight{cap="model:glm-5"} 2
inflight_in_flight{cap="provider"} 5
inflight_in_flight{cap="tenant"} 0
# HELP inflight_limit The limit; +Inf when unlimited.
# TYPE inflight_limit gauge
inflight_limit{cap="model:glm-5"} +Inf
inflight_limit{cap="provider"} 5
# HELP inflight_waiting Callers waiting for a slot now.
# TYPE inflight_waiting gauge
inflight_waiting{cap="provider"} 8
inflight_waiting{cap="tenant"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "inflight_in_flight", "inflight_limit", "inflight_waiting"))
	assert.Equal(t, 1, testutil.CollectAndCount(model, "inflight_in_flight"), "no counters without Counts")
	assert.Zero(t, testutil.CollectAndCount(model, "inflight_acquired_total"))
	assert.Zero(t, testutil.CollectAndCount(model, "inflight_wait_seconds", "inflight_hold_seconds"), "no empty histograms for a cap nobody feeds")
	assert.Equal(t, 2, testutil.CollectAndCount(provider, "inflight_wait_seconds", "inflight_hold_seconds"), "fed once: both appear")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
