package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// delayedBody gives its content after a wait, on its first Read: an answer
// that takes that long.
type delayedBody struct {
	d    time.Duration
	r    io.Reader
	once sync.Once
}

func (b *delayedBody) Read(p []byte) (int, error) {
	b.once.Do(func() { time.Sleep(b.d) })
	return b.r.Read(p)
}
func (b *delayedBody) Close() error { return nil }

type started struct {
	at        time.Time
	est, used int
}

// checkWindows checks that over every 60 s window the tokens used by the
// requests started in it are at most limit and the largest error of one
// estimate (used over estimated) among them.
func checkWindows(t *testing.T, name string, all []started, limit int) {
	t.Helper()
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	bad := 0
	for i := range all {
		sum, worst, errs := 0, 0, 0
		var seen []string
		for j := i; j < len(all) && all[j].at.Sub(all[i].at) < time.Minute; j++ {
			sum += all[j].used
			worst = max(worst, all[j].used-all[j].est)
			errs += max(all[j].used-all[j].est, 0)
			seen = append(seen, fmt.Sprintf("%s %d/%d", all[j].at.Format("04:05.000"), all[j].used, all[j].est))
		}
		if sum > limit+worst && bad < 3 {
			bad++
			t.Logf("%s: from %v, %d tokens started within 60 s, over %d + %d (errors %d): %v", name, all[i].at.Format("15:04:05.000"), sum, limit, worst, errs, seen)
		}
		if sum > limit+errs {
			t.Errorf("%s: from %v, %d tokens started within 60 s, over %d + all errors %d: %v", name, all[i].at.Format("15:04:05.000"), sum, limit, errs, seen)
		}
	}
}

// Requests through a Transport for ten minutes, on the bubble's clock,
// their answers taking up to 90 s and using from a fifth to twice their
// estimates, some refused by the upstream: over every 60 s window, the
// tokens started are at most the Gate's budget plus the estimate errors
// of the requests started in that window, and so are they for a tenant's
// Budget of 700 kept beside it (WithBudgets), the one that binds. With
// one request at a time the bound is the largest single error; with three
// in flight, their underestimates add up (logged, not an error: each
// started while the others' usage was unknown).
func TestWindowsThroughTransport(t *testing.T) {
	for _, conc := range []int{1, 3} {
		t.Run(fmt.Sprint("concurrency ", conc), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				const limit, ownLimit = 1000, 700 // the tenant's binds first
				gate := tGate(t, pacing.Config{MaxConcurrentRequests: conc, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: limit}, MaxQueueWaitMS: 200_000})
				own, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: ownLimit})
				require.NoError(t, err)
				var mu sync.Mutex
				var all []started
				rng := rand.New(rand.NewPCG(1, uint64(conc)))
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					_, _ = io.Copy(io.Discard, r.Body)
					r.Body.Close()
					est, _ := r.Context().Value(estKey{}).(pacing.Tokens)
					mu.Lock()
					refuse := rng.IntN(5) == 0
					f := 0.2 + 1.8*rng.Float64()
					d := time.Duration(rng.IntN(90_000)) * time.Millisecond
					used := int(float64(est.Total()) * f)
					if !refuse {
						all = append(all, started{time.Now(), est.Total(), used})
					}
					mu.Unlock()
					if refuse {
						return &http.Response{StatusCode: 429, Header: http.Header{"Content-Type": {"application/json"}},
							Body: io.NopCloser(strings.NewReader(`{"error":{"message":"busy"}}`)), Request: r}, nil
					}
					return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
						Body: &delayedBody{d: d, r: strings.NewReader(fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":0}}`, used))}, Request: r}, nil
				})
				rt := pacing.NewTransport(base, gate, pacing.WithCutLinger(0), pacing.WithBudgets(func(_ context.Context, _ string, cost pacing.Tokens) (*pacing.Reservation, error) {
					return own.Reserve(cost)
				}))
				end := time.Now().Add(10 * time.Minute)
				var wg sync.WaitGroup
				for c := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; time.Now().Before(end); i++ {
							est := pacing.Tokens{Input: 50 + (c*97+i*31)%350}
							ctx := context.WithValue(pacing.WithTokens(context.Background(), est), estKey{}, est)
							resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
							var le *slots.LimitError
							if errors.As(err, &le) {
								time.Sleep(max(le.RetryAfter, time.Second))
								continue
							}
							if !assert.NoError(t, err) {
								return
							}
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					}()
				}
				wg.Wait()
				t.Logf("%d requests served", len(all))
				checkWindows(t, "the Gate's", all, limit)
				checkWindows(t, "the tenant's", all, ownLimit)
			})
		})
	}
}

type estKey struct{}
