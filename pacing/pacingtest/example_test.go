package pacingtest_test

import (
	"fmt"
	"time"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
)

// A Gate capped at the upstream's hidden cap of 4 draws no 429. In a test,
// run Score inside testing/synctest.Test, where a scenario of minutes takes
// no real time; this one, of 300 ms, runs on the real clock.
func ExampleScore() {
	sc := pacingtest.Scenario{Name: "cap 4", Schedule: []pacingtest.Step{{At: 0, Cap: 4}},
		Duration: 300 * time.Millisecond, Rate: 100, Median: 10 * time.Millisecond, Seed: 1}
	res := pacingtest.Score(sc, pacing.Config{MaxConcurrentRequests: 4})
	fmt.Println("answered 429:", res.Upstream.Refused, "served some:", res.Upstream.Served > 0)
	// Output: answered 429: 0 served some: true
}
