package fleet

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A fleet's learned cap under an upstream that answers every request with
// a rate limit's 429 (or a quota's) stays where it was: the probes were
// answered, and proved nothing. (They were taken for admitted once
// unanswered for a Gap, and the cap climbed 4, 5, 7, 11, ... on 429s alone.)
func TestFleetLearnedCapUnderRateLimitsOnly(t *testing.T) {
	for _, kind := range []upstream.Kind{upstream.Rate, upstream.Quota} {
		t.Run(kind.String(), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				r := New[string](memstore.New(), slots.Unlimited, WithLogger(quiet()))
				t.Cleanup(r.Close)
				require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 4, Max: 64, RetestMS: 60_000}))
				synctest.Wait()
				for range 6 {
					var held []*slots.Slot
					for range r.Learned("p").Limit {
						s, err := r.TryAcquire("p")
						require.NoError(t, err)
						held = append(held, s)
					}
					for _, s := range held {
						r.Report(s, upstream.Verdict{Kind: kind, RetryAfter: time.Second})
						s.Release()
					}
					time.Sleep(3 * time.Second) // past any Gap
					synctest.Wait()
				}
				assert.Equal(t, 4, r.Learned("p").Cap)
			})
		})
	}
}
