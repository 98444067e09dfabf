package redisstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkNoneFits measures a newcomer's admission call on a key whose
// queued waiters are all heavy (noneFits answers for serve): 63 waiters
// of one key, 50 to 59 units each, behind a holder of 60 units under a
// limit of 100; each newcomer of 45 units is refused. It reports the
// server's script time and the Redis commands per call (see
// BenchmarkServeWave). The queue's summary (summary.go) lets the newcomer
// pass the head without reading the waiters behind it: some 44 µs of
// script time per call, where reading them (the queue's hash, <key>#t,
// some 440 fields, is a listpack under Redis's defaults, where each HMGET
// field is a linear look) took 430–500 µs.
//
//	go test -run '^$' -bench NoneFits -benchtime 1x ./registry/fleet/redisstore
func BenchmarkNoneFits(b *testing.B) {
	rig := newQueueRig(b)
	ctx := context.Background()
	const limit, calls = 100, 2000
	var us, cmds []float64
	for i := range b.N {
		b.StopTimer()
		require.NoError(b, rig.rdb.FlushAll(ctx).Err())
		rig.alive("p1")
		require.Equal(b, acquireAdmitted, rig.admit(ticket{id: "h", units: 60}, limit).status)
		for w := range 63 {
			require.Equal(b, acquireQueued, rig.admit(ticket{id: fmt.Sprint("w", w), units: 50 + w%10, wait: true}, limit).status)
		}
		b.StartTimer()
		before := serverStats(b, rig)
		for j := range calls {
			require.Equal(b, acquireFull, rig.admit(ticket{id: fmt.Sprint("n", i, "-", j), units: 45}, limit).status)
		}
		after := serverStats(b, rig)
		us = append(us, (after.scriptUS-before.scriptUS)/calls)
		cmds = append(cmds, float64(after.calls-before.calls)/calls)
	}
	b.ReportMetric(us[len(us)/2], "newcomer-µs")
	b.ReportMetric(cmds[len(cmds)/2], "newcomer-calls")
}
