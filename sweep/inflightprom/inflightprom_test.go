package inflightprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
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
	reg := registry.New[string](1, registry.WithObserver(c), registry.WithClock(mock))
	inflightprom.WatchRegistry(c, reg)

	a, err := reg.TryAcquire("org-a")
	require.NoError(t, err)
	_, err = reg.TryAcquire("org-a")
	require.Error(t, err)
	b, err := reg.TryAcquire("org-b")
	require.NoError(t, err)
	mock.Add(3 * time.Second)
	b.Release()
	b.Release()

	const want = `
# HELP inflight_tenant_acquired_total Admissions that took capacity.
# TYPE inflight_tenant_acquired_total counter
inflight_tenant_acquired_total 2
# HELP inflight_tenant_double_releases_total Release calls on a slot already released.
# TYPE inflight_tenant_double_releases_total counter
inflight_tenant_double_releases_total 1
# HELP inflight_tenant_in_flight Slots held now; a slot held under several keys counts once per key.
# TYPE inflight_tenant_in_flight gauge
inflight_tenant_in_flight 1
# HELP inflight_tenant_keys Keys tracked now: with a holder or a waiter.
# TYPE inflight_tenant_keys gauge
inflight_tenant_keys 1
# HELP inflight_tenant_rejected_total Rejections, by reason.
# TYPE inflight_tenant_rejected_total counter
inflight_tenant_rejected_total{reason="canceled"} 0
inflight_tenant_rejected_total{reason="invalid_key"} 0
inflight_tenant_rejected_total{reason="limit_reached"} 1
inflight_tenant_rejected_total{reason="queue_full"} 0
inflight_tenant_rejected_total{reason="wait_timeout"} 0
# HELP inflight_tenant_released_total Capacity given back.
# TYPE inflight_tenant_released_total counter
inflight_tenant_released_total 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"inflight_tenant_acquired_total", "inflight_tenant_double_releases_total", "inflight_tenant_in_flight",
		"inflight_tenant_keys", "inflight_tenant_rejected_total", "inflight_tenant_released_total"))

	hold := `
# HELP inflight_tenant_hold_seconds How long slots were held.
# TYPE inflight_tenant_hold_seconds histogram
inflight_tenant_hold_seconds_bucket{le="0.05"} 0
inflight_tenant_hold_seconds_bucket{le="0.1"} 0
inflight_tenant_hold_seconds_bucket{le="0.2"} 0
inflight_tenant_hold_seconds_bucket{le="0.4"} 0
inflight_tenant_hold_seconds_bucket{le="0.8"} 0
inflight_tenant_hold_seconds_bucket{le="1.6"} 0
inflight_tenant_hold_seconds_bucket{le="3.2"} 1
inflight_tenant_hold_seconds_bucket{le="6.4"} 1
inflight_tenant_hold_seconds_bucket{le="12.8"} 1
inflight_tenant_hold_seconds_bucket{le="25.6"} 1
inflight_tenant_hold_seconds_bucket{le="51.2"} 1
inflight_tenant_hold_seconds_bucket{le="102.4"} 1
inflight_tenant_hold_seconds_bucket{le="204.8"} 1
inflight_tenant_hold_seconds_bucket{le="409.6"} 1
inflight_tenant_hold_seconds_bucket{le="819.2"} 1
inflight_tenant_hold_seconds_bucket{le="1638.4"} 1
inflight_tenant_hold_seconds_bucket{le="+Inf"} 1
inflight_tenant_hold_seconds_sum 3
inflight_tenant_hold_seconds_count 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(hold), "inflight_tenant_hold_seconds"))
	a.Release()
	assert.Equal(t, 2, testutil.CollectAndCount(c, "inflight_tenant_wait_seconds", "inflight_tenant_hold_seconds"))
}

func TestLimiterMetrics(t *testing.T) {
	c := inflightprom.New("upstream")
	assert.Equal(t, 2, testutil.CollectAndCount(c), "before Watch: only the histograms")
	lim := slots.NewLimiter(8, slots.WithObserver(c))
	inflightprom.WatchLimiter(c, lim)
	s, _ := lim.TryAcquire()
	assert.Equal(t, 8.0, testutil.ToFloat64(collectorFor(c, "inflight_upstream_limit")))
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(c, "inflight_upstream_in_flight")))
	s.Release()
	assert.Zero(t, testutil.CollectAndCount(c, "inflight_upstream_keys"), "a limiter has no keys gauge")
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
