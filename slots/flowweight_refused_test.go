package slots_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// A caller refused for a full queue leaves its flow's turns as they were:
// its weight (3) is not its flow's, since it never waited. So is one that
// gave up waiting. Flows a and b, both weighted 1, take one turn each.
func TestFlowWeightOfACallerThatLeft(t *testing.T) {
	for _, how := range []string{"refused", "canceled"} {
		t.Run(how, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				l := slots.NewLimiter(4, slots.WithMaxQueue(5))
				all, err := l.TryAcquireN(4)
				require.NoError(t, err)
				var mu sync.Mutex
				var got []string
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				wait := func(name, flow string, weight, n int) {
					go func() {
						s, err := l.AcquireN(slots.WithFlowWeight(ctx, flow, weight), n)
						if err != nil {
							return
						}
						mu.Lock()
						got = append(got, name)
						mu.Unlock()
						<-ctx.Done()
						s.Release()
					}()
					synctest.Wait()
				}
				wait("h", "h", 1, 2) // heavy: newcomers queue beside it
				wait("a1", "a", 1, 1)
				wait("a2", "a", 1, 1)
				wait("b1", "b", 1, 1)
				if how == "refused" {
					wait("b2", "b", 1, 1)
					_, err = l.AcquireN(slots.WithFlowWeight(context.Background(), "a", 3), 1)
					require.ErrorIs(t, err, slots.ErrQueueFull)
				} else {
					left, stop := context.WithCancel(ctx)
					go l.AcquireN(slots.WithFlowWeight(left, "a", 3), 1)
					synctest.Wait()
					stop()
					synctest.Wait()
				}
				require.Equal(t, 4+slices.Index([]string{"canceled", "refused"}, how), l.Waiting())
				all.Release()
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				assert.ElementsMatch(t, []string{"h", "a1", "b1"}, got, "a's turn is of weight 1")
			})
		})
	}
}
