package fleet

import (
	"flag"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
)

// movingCap is a hidden cap that drops and rises, in phases of 4 s, under
// demand over every one of its values.
var movingCap = learnScenario{
	schedule: []pacingtest.Step{{At: 0, Cap: 12}, {At: 4 * time.Second, Cap: 5}, {At: 8 * time.Second, Cap: 15}},
	phase:    4 * time.Second, rate: 120, median: 200 * time.Millisecond, retest: time.Second,
}

// learnVirtual runs sc against n processes learning one cap on a virtual
// Redis with latency each way, in virtual time.
func learnVirtual(t *testing.T, sc learnScenario, n int, latency time.Duration) (res learnResult) {
	synctest.Test(t, func(t *testing.T) {
		v := newVirtualRedis(t, latency)
		rs := learnFleet(t, v, "learn-virtual", n, pacing.AdaptiveConfig{Max: 64, RetestMS: sc.retest.Milliseconds()})
		res = runLearning(t, rs, sc)
	})
	return res
}

// Three processes learn one hidden cap that drops and rises as well as one
// process does: the share of 429s stays low, and each phase ends with every
// process's cap near the hidden one. In virtual time, on a virtual Redis
// that runs the fleet's scripts: the scores do not depend on how busy the
// machine is. (TestFleetLearnsAMovingCap plays the same on a real
// redis-server and real clock, and checks what holds on any machine.)
func TestFleetLearnsAMovingCapVirtual(t *testing.T) {
	if testing.Short() {
		t.Skip("two virtual runs of 12 s, some 30 s of CPU under -race")
	}
	shares := map[int]float64{}
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d processes", n), func(t *testing.T) {
			res := learnVirtual(t, movingCap, n, fwLatency)
			logLearning(t, movingCap, n, res)
			share := res.refusedShare()
			shares[n] = share
			require.Len(t, res.caps, len(movingCap.schedule))
			assert.Less(t, share, 0.10, "429s of attempts")
			for i, caps := range res.caps {
				for j, c := range caps {
					assert.InDelta(t, movingCap.schedule[i].Cap, c, 2, "phase %d, registry %d", i+1, j)
				}
			}
			assert.Greater(t, res.u.Served, 300, "the fleet kept the upstream busy")
		})
	}
	if len(shares) == 2 {
		assert.LessOrEqual(t, shares[3], 1.5*shares[1]+0.01, "three processes draw about the 429s of one")
	}
}

var latencySweep = flag.Bool("latency-sweep", false, "print how a fleet learning a moving cap fares as its Redis slows down, in virtual time")

// With -latency-sweep, the moving cap learned by one and three processes on
// a virtual Redis whose replies take longer and longer: what a busy
// machine, or a Redis far away, does to the learned cap.
func TestFleetLearningUnderRedisLatency(t *testing.T) {
	if !*latencySweep {
		t.Skip("a table for reading, with -latency-sweep")
	}
	for _, latency := range []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
		for _, n := range []int{1, 3} {
			res := learnVirtual(t, movingCap, n, latency)
			t.Logf("latency %5v each way, %d processes: %5.1f%% 429s, %4d served, %4d turned away, caps at the phases' ends %v",
				latency, n, 100*res.refusedShare(), res.u.Served, res.turned, res.caps)
		}
	}
}
