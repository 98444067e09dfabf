package pacingtest_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
)

func send(t *testing.T, u *pacingtest.Upstream, service time.Duration) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://upstream.invalid/", nil)
	require.NoError(t, err)
	req.Header.Set(pacingtest.ServiceHeader, service.String())
	resp, err := u.RoundTrip(req)
	require.NoError(t, err)
	return resp
}

func TestUpstream(t *testing.T) {
	t.Run("refuses a request over the cap, with a Z.ai 1302 that classifies as concurrency", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{At: 0, Cap: 2}}, Foreign: 1}
			u.Start()
			held := send(t, u, time.Minute)
			assert.Equal(t, http.StatusOK, held.StatusCode)
			start := time.Now()
			resp := send(t, u, time.Minute)
			assert.Equal(t, 50*time.Millisecond, time.Since(start), "a refusal takes RefusalDelay")
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "1", resp.Header.Get("Retry-After"))
			v := pacing.Classify(resp, nil)
			assert.Equal(t, pacing.Verdict{Kind: pacing.Concurrency, RetryAfter: time.Second}, v)
			body, _ := io.ReadAll(resp.Body)
			assert.Contains(t, string(body), `"1302"`)
			held.Body.Close()
			assert.Equal(t, pacingtest.Counts{Attempts: 2, Refused: 1, Peak: 2}, u.Counts())
		})
	})
	t.Run("spreads the refusals' times around RefusalDelay with RefusalSigma", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{At: 0, Cap: 1}}, Foreign: 1, RefusalSigma: 0.75, Seed: 7}
			u.Start()
			var took []time.Duration
			for range 1000 {
				start := time.Now()
				resp := send(t, u, time.Second)
				require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			median, p90 := took[len(took)/2], took[len(took)*9/10]
			// A lognormal of shape 0.75: the median is RefusalDelay, the
			// 90th percentile e^(0.75·1.28) = 2.6 times it.
			assert.InDelta(t, 50*time.Millisecond, median, float64(5*time.Millisecond), "median")
			assert.InDelta(t, 130*time.Millisecond, p90, float64(20*time.Millisecond), "90th percentile")
			assert.Equal(t, pacingtest.Counts{Attempts: 1000, Refused: 1000}, u.Counts())
		})
	})
	t.Run("holds a place until the answer has streamed for its service time", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{At: 0, Cap: 1}}}
			u.Start()
			start := time.Now()
			resp := send(t, u, 5*time.Second)
			assert.Equal(t, 300*time.Millisecond, time.Since(start), "headers after HeaderDelay")
			var wg sync.WaitGroup
			wg.Go(func() {
				_, err := io.Copy(io.Discard, resp.Body)
				assert.NoError(t, err)
				assert.Equal(t, 5*time.Second, time.Since(start))
			})
			time.Sleep(4 * time.Second)
			assert.Equal(t, http.StatusTooManyRequests, send(t, u, time.Second).StatusCode, "still streaming")
			wg.Wait()
			last := send(t, u, 0)
			assert.Equal(t, http.StatusOK, last.StatusCode, "its place is free")
			_, _ = io.Copy(io.Discard, last.Body)
			c := u.Counts()
			assert.Equal(t, 2, c.Served)
			assert.Equal(t, 5*time.Second, c.Work)
		})
	})
	t.Run("follows its schedule", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{At: 0, Cap: 20}, {At: time.Minute, Cap: 8}}}
			u.Start()
			assert.Equal(t, 20, u.Cap())
			time.Sleep(time.Minute)
			assert.Equal(t, 8, u.Cap())
		})
	})
	t.Run("a request whose context ends frees its place", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{At: 0, Cap: 1}}}
			u.Start()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.invalid/", nil)
			req.Header.Set(pacingtest.ServiceHeader, "1m")
			resp, err := u.RoundTrip(req)
			require.NoError(t, err)
			_, err = io.Copy(io.Discard, resp.Body)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Equal(t, http.StatusOK, send(t, u, 0).StatusCode)
		})
	})
}

func TestScoreAgainstAKnownCap(t *testing.T) {
	sc := pacingtest.Scenario{Name: "steady", Schedule: []pacingtest.Step{{At: 0, Cap: 5}}, Duration: time.Minute,
		Rate: 10, Median: time.Second, Seed: 7}
	testrig.Bubble(t, func(t *testing.T) {
		r := pacingtest.Score(sc, pacing.Config{MaxConcurrentRequests: 5})
		assert.Zero(t, r.Upstream.Refused, "a cap at the hidden one is never refused")
		assert.Equal(t, 5, r.Upstream.Peak)
		assert.Equal(t, []time.Duration{pacingtest.SampleEvery}, r.Settle, "from the first sample")
	})
	testrig.Bubble(t, func(t *testing.T) {
		r := pacingtest.Score(sc, pacing.Config{MaxConcurrentRequests: 8})
		assert.Greater(t, r.Upstream.Refused, 0, "a cap over the hidden one is refused")
		assert.Equal(t, []time.Duration{-1}, r.Settle)
	})
}
