package fleet

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing/pacingtest"
	"github.com/inflight-go/inflight/pacing/upstream"
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
	testrig.Bubble(t, func(t *testing.T) {
		v := newVirtualRedis(t, latency)
		rs := learnFleet(t, v, "learn-virtual", n, upstream.AdaptiveConfig{Max: 64, RetestMS: sc.retest.Milliseconds()})
		res = runLearning(t, rs, sc)
	})
	return res
}

// Three processes learn one hidden cap that drops and rises as well as one
// process does: the share of 429s stays low, and each phase ends with every
// process's cap near the hidden one; also when Redis takes 2 ms each way to
// answer, as on a busy machine (where a cut used to reach the other
// processes too late: 10.6% and 19% 429s in two runs, to one process's
// 5.4% and 6%). In virtual time, on a virtual Redis that runs the fleet's
// scripts: the scores do not depend on how busy the machine is.
// (TestFleetLearnsAMovingCap plays the same on a real redis-server and a
// real clock, and checks what holds on any machine.)
func TestFleetLearnsAMovingCapVirtual(t *testing.T) {
	if testing.Short() {
		t.Skip("three virtual runs of 12 s, some 45 s of CPU under -race")
	}
	for _, tc := range []struct {
		n       int
		latency time.Duration
	}{{1, fwLatency}, {3, fwLatency}, {3, 2 * time.Millisecond}} {
		t.Run(fmt.Sprintf("%d processes, Redis at %v", tc.n, tc.latency), func(t *testing.T) {
			res := learnVirtual(t, movingCap, tc.n, tc.latency)
			logLearning(t, movingCap, tc.n, res)
			require.Len(t, res.caps, len(movingCap.schedule))
			// Runs differ a little: starts of the same instant reach the
			// upstream in the order the scheduler runs them. Over eight runs
			// of each (five of them before the learned state's write took
			// its final form), one process drew 4.2–5.4%, three 3.9–5.3%,
			// and three on a Redis at 2 ms 4.5–7.0%.
			assert.Less(t, res.refusedShare(), 0.09, "429s of attempts")
			for i, caps := range res.caps {
				for j, c := range caps {
					assert.InDelta(t, movingCap.schedule[i].Cap, c, 2, "phase %d, registry %d", i+1, j)
				}
			}
			assert.Greater(t, res.u.Served, 300, "the fleet kept the upstream busy")
		})
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
