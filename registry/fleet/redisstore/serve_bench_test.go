package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkServeWave measures what a wave of hand-offs costs the server,
// as LargeAmongSmall (fleettest.Bench) makes them: a key of 500,000 units
// taken by 250 newcomers of 2,000, with 250 waiters of 1,000 to 3,000
// units queued behind them, each of which asks again once (as it does
// once a claim window); one release call frees 80 leases, and each
// waiter it grants claims its grant. It reports, from the server's
// command statistics (INFO commandstats), the median over iterations of
// a newcomer's admission, a waiter's ask that queues it and the one
// that finds it queued (again), the release script's time per grant and
// a claim's time, and the Redis commands each runs (calls inside a
// script included). Server times
// move with the machine: compare builds in one run, interleaved.
//
//	go test -run '^$' -bench ServeWave -benchtime 20x ./registry/fleet/redisstore
func BenchmarkServeWave(b *testing.B) {
	rig := newQueueRig(b)
	ctx := context.Background()
	const limit, holders, waiters, released = 500_000, 250, 250, 80
	var admit, ask, again, release, claim []float64
	var admitCalls, askCalls, againCalls, releaseCalls, claimCalls []float64
	for i := range b.N {
		b.StopTimer()
		require.NoError(b, rig.rdb.FlushAll(ctx).Err())
		rig.alive("p1")
		rng := rand.New(rand.NewPCG(uint64(i), 1))
		start := serverStats(b, rig)
		for h := range holders {
			require.Equal(b, acquireAdmitted, rig.admit(ticket{id: fmt.Sprint("h", h), units: 2000}, limit).status)
		}
		full := serverStats(b, rig)
		admit = append(admit, (full.scriptUS-start.scriptUS)/holders)
		admitCalls = append(admitCalls, float64(full.calls-start.calls)/holders)
		units := map[string]int{}
		for w := range waiters {
			id := fmt.Sprint("w", w)
			units[id] = 1000 + rng.IntN(2001)
			require.Equal(b, acquireQueued, rig.admit(ticket{id: id, units: units[id], wait: true}, limit).status)
		}
		queued := serverStats(b, rig)
		ask = append(ask, (queued.scriptUS-full.scriptUS)/waiters)
		askCalls = append(askCalls, float64(queued.calls-full.calls)/waiters)
		for w := range waiters { // each asks again, as once a claim window
			id := fmt.Sprint("w", w)
			require.Equal(b, acquireQueued, rig.admit(ticket{id: id, units: units[id], wait: true}, limit).status)
		}
		b.StartTimer()
		before := serverStats(b, rig)
		again = append(again, (before.scriptUS-queued.scriptUS)/waiters)
		againCalls = append(againCalls, float64(before.calls-queued.calls)/waiters)
		keys, args := []string{"q{n}#pause", qProcs}, []any{qClaim, qWake}
		for h := range released {
			keys, args = append(keys, qKey), append(args, fmt.Sprint("h", h), limit)
		}
		require.NoError(b, releaseScript.Run(ctx, rig.rdb, append(keys, qHeard), append(args, qTTL, 0)...).Err())
		after := serverStats(b, rig)
		granted, err := rig.rdb.ZRange(ctx, qKey+"#g", 0, -1).Result()
		require.NoError(b, err)
		require.NotEmpty(b, granted)
		n := float64(len(granted))
		release = append(release, (after.scriptUS-before.scriptUS)/n)
		releaseCalls = append(releaseCalls, float64(after.calls-before.calls)/n)
		for _, id := range granted {
			require.Equal(b, acquireAdmitted, rig.admit(ticket{id: id, units: units[id], wait: true}, limit).status)
		}
		done := serverStats(b, rig)
		claim = append(claim, (done.scriptUS-after.scriptUS)/n)
		claimCalls = append(claimCalls, float64(done.calls-after.calls)/n)
	}
	median := func(x []float64) float64 {
		slices.Sort(x)
		return x[len(x)/2]
	}
	b.ReportMetric(median(admit), "admit-µs")
	b.ReportMetric(median(admitCalls), "admit-calls")
	b.ReportMetric(median(ask), "ask-µs")
	b.ReportMetric(median(askCalls), "ask-calls")
	b.ReportMetric(median(again), "again-µs")
	b.ReportMetric(median(againCalls), "again-calls")
	b.ReportMetric(median(release), "release-µs/grant")
	b.ReportMetric(median(releaseCalls), "release-calls/grant")
	b.ReportMetric(median(claim), "claim-µs")
	b.ReportMetric(median(claimCalls), "claim-calls")
}

// commandStats is what INFO commandstats counts: the scripts' time in
// microseconds, and the commands run inside them.
type commandStats struct {
	scriptUS float64
	calls    int
}

func serverStats(b *testing.B, rig *queueRig) commandStats {
	info, err := rig.rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(b, err)
	var st commandStats
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		var n int
		var us float64
		if _, err := fmt.Sscanf(fields, "calls=%d,usec=%f", &n, &us); err != nil {
			continue
		}
		switch {
		case name == "evalsha":
			st.scriptUS += us
		case name == "info" || strings.HasPrefix(name, "config"):
		default:
			st.calls += n
		}
	}
	return st
}
