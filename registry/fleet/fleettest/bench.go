package fleettest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet"
)

// Bench measures a store on srv, each measurement a sub-benchmark that
// reports what it saw. Each iteration is a whole scenario on a real
// clock, so run it with -benchtime 1x:
//
//	func BenchmarkFleet(b *testing.B) { fleettest.Bench(b, myServer(b)) }
//
// LargeAmongSmall: 8 requests of 500,000 tokens among 1,000 of 1,000 to
// 3,000, sent at once over 3 processes that share a cap of 1,000,000
// tokens, held 3 s and 200 ms. It reports the small requests' share of
// the token-seconds the large ones left free while small ones waited
// (small-share-%), when the last small one ended and the last large one
// started (ms), the token-seconds the cache idled while small ones
// waited, and the peak in flight, counted apart from the store; it fails
// if the peak passes the cap or a request is not served.
func Bench(b *testing.B, srv Server) {
	b.Run("LargeAmongSmall", func(b *testing.B) {
		load := testrig.LargePrompts{Cache: 1_000_000, Large: 8, LargeUnits: 500_000, Small: 1000,
			LargeHold: 3 * time.Second, SmallHold: 200 * time.Millisecond}
		var s testrig.TokenScore
		for i := range b.N {
			rs := processes(b, srv, fmt.Sprint("bench-large-", i), 3, load.Cache,
				fleet.WithLeaseTTL(30*time.Second), fleet.WithTimeout(2*slowCalls))
			s = load.Run(func(i, n int) (func(), error) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				sl, err := rs[i%len(rs)].AcquireN(ctx, "tokens", n)
				if err != nil {
					return nil, err
				}
				return func() { sl.Release() }, nil
			})
			if s.Served != load.Large+load.Small || s.Peak > load.Cache {
				b.Fatalf("%d of %d served, peak %d tokens of %d", s.Served, load.Large+load.Small, s.Peak, load.Cache)
			}
		}
		b.ReportMetric(100*s.SmallShare, "small-share-%")
		b.ReportMetric(float64(s.SmallDone.Milliseconds()), "small-done-ms")
		b.ReportMetric(float64(s.LargeStart.Milliseconds()), "large-start-ms")
		b.ReportMetric(s.Idle/1e6, "idle-Mtoken-s")
		b.ReportMetric(float64(s.Peak), "peak-tokens")
	})
}
