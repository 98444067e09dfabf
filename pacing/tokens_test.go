package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// acquireNAsync starts an AcquireN and delivers its outcome.
func acquireNAsync(ctx context.Context, g *pacing.Gate, model string, n int) chan result {
	c := make(chan result, 1)
	go func() {
		gt, err := g.AcquireN(ctx, model, n)
		c <- result{gt, err}
	}()
	return c
}

// The provider's tokens in flight are capped, a request's Slot frees its
// tokens, and a request waiting for tokens lets lighter ones after it
// start until they have taken its bound (core.PassFactor times its tokens
// in its flow); then it keeps its place: a
// lighter one after it waits too, although it would fit.
func TestGateTokensInFlight(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 100})
		ctx := context.Background()
		a, err := g.AcquireN(ctx, "m", 60)
		require.NoError(t, err)
		st := g.Status()
		assert.Equal(t, 60, st.Tokens)
		assert.Equal(t, 100, st.TokenLimit)
		assert.Equal(t, map[string]int{"m": 60}, st.TokensByModel)

		heavy := acquireNAsync(ctx, g, "m", 50)
		synctest.Wait()
		light, err := g.AcquireN(ctx, "other", 30)
		require.NoError(t, err, "40 tokens free: the 30 passes the 50")
		passTokens(t, g, "other", 50*core.PassFactor-30) // its bound has passed it
		later := acquireNAsync(ctx, g, "other", 5)
		synctest.Wait()
		assert.Equal(t, 2, g.Status().Queued, "10 tokens free: the 5 waits behind the 50 now")

		a.Slot.Release()
		synctest.Wait()
		h, l := <-heavy, <-later
		require.NoError(t, h.err)
		require.NoError(t, l.err)
		assert.Equal(t, 85, g.Status().Tokens)
		h.g.Slot.Release()
		l.g.Slot.Release()
		light.Slot.Release()
		st = g.Status()
		assert.Equal(t, 0, st.Tokens)
		assert.Equal(t, 0, st.InFlight)
		assert.Empty(t, st.TokensByModel)
	})
}

// A model's tokens are capped apart: a request waiting for its model's
// tokens, once passed by its bound, holds back that model's later
// requests, not another model's.
func TestGateModelTokens(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Models: map[string]pacing.ModelConfig{"big": {MaxInflightTokens: 50}}})
		ctx := context.Background()
		a, err := g.AcquireN(ctx, "big", 20)
		require.NoError(t, err)
		heavy := acquireNAsync(ctx, g, "big", 40)
		synctest.Wait()
		passTokens(t, g, "big", 40*core.PassFactor)
		later := acquireNAsync(ctx, g, "big", 5)
		synctest.Wait()
		other, err := g.AcquireN(ctx, "small", 1000)
		require.NoError(t, err, "another model is not held back")
		assert.Equal(t, 2, g.Status().Queued, "the model's later request waits behind its heavy one")

		_, err = g.AcquireN(ctx, "big", 51)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapModelTokens, le.Cap)
		assert.Equal(t, 50, le.Limit)

		a.Slot.Release()
		synctest.Wait()
		h, l := <-heavy, <-later
		require.NoError(t, h.err)
		require.NoError(t, l.err)
		h.g.Slot.Release()
		l.g.Slot.Release()
		other.Slot.Release()
		assert.Equal(t, 0, g.Status().Tokens)
	})
}

// A request heavier than a token cap is refused at once with
// ErrExceedsLimit (answered 413), one waiting is refused when Reconfigure
// lowers the cap below it, and n out of range fails with ErrBadUnits.
func TestGateTokensTooHeavy(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := pacing.Config{MaxInflightTokens: 100}
		g := newGate(t, cfg)
		ctx := context.Background()
		_, err := g.AcquireN(ctx, "m", 101)
		require.ErrorIs(t, err, slots.ErrExceedsLimit)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapTokens, le.Cap)
		status, retry := slots.HTTPStatus(err)
		assert.Equal(t, 413, status)
		assert.Zero(t, retry)
		for _, n := range []int{0, -1, slots.MaxUnits + 1} {
			_, err = g.AcquireN(ctx, "m", n)
			assert.ErrorIs(t, err, slots.ErrBadUnits)
		}

		a, err := g.AcquireN(ctx, "m", 70)
		require.NoError(t, err)
		waiting := acquireNAsync(ctx, g, "m", 90)
		synctest.Wait()
		passTokens(t, g, "m", 90*core.PassFactor)
		fits := acquireNAsync(ctx, g, "m", 10)
		synctest.Wait()
		assert.Equal(t, 2, g.Status().Queued)
		cfg.MaxInflightTokens = 80
		require.NoError(t, g.Reconfigure(cfg))
		synctest.Wait()
		r := <-waiting
		assert.ErrorIs(t, r.err, slots.ErrExceedsLimit, "90 tokens can never fit a cap of 80")
		require.ErrorAs(t, r.err, &le)
		assert.Equal(t, 80, le.Limit)
		f := <-fits
		require.NoError(t, f.err, "the request it held back fits the 10 tokens left")
		f.g.Slot.Release()
		a.Slot.Release()
		st := g.Status()
		assert.Equal(t, 0, st.Tokens)
		assert.Equal(t, 0, st.Queued)
	})
}

// A Transport admits a request with the tokens its context carries.
func TestTransportWeighsTokens(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 100})
		var during atomic.Int64
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			during.Store(int64(g.Status().Tokens))
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
		})
		client := &http.Client{Transport: pacing.NewTransport(base, g)}
		ctx := pacing.WithModelName(pacing.WithTokens(context.Background(), pacing.Tokens{Input: 42}), "m")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.test/v1/chat/completions", nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		assert.Equal(t, int64(42), during.Load(), "42 tokens in flight while the upstream answered")
		_, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, 0, g.Status().Tokens)

		req, err = http.NewRequestWithContext(pacing.WithTokens(ctx, pacing.Tokens{Input: 101}), http.MethodPost, "http://upstream.test/v1/chat/completions", nil)
		require.NoError(t, err)
		_, err = client.Do(req)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
	})
}

// TestGateTokensHammer: 32 goroutines take 1 to 40 tokens of three models
// with AcquireN, with cancellations racing their grants and the caps moving
// between 60 and 100 (provider) and 30 and 50 (one model); independent
// counts check the provider's and the model's tokens at every admission.
func TestGateTokensHammer(t *testing.T) {
	cfg := func(rng *rand.Rand) pacing.Config {
		return pacing.Config{MaxInflightTokens: 60 + 40*rng.IntN(2), MaxQueueWaitMS: 5,
			Models: map[string]pacing.ModelConfig{"m0": {MaxInflightTokens: 30 + 20*rng.IntN(2)}}}
	}
	g := newGate(t, cfg(rand.New(rand.NewPCG(1, 1))))
	var total, model0, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 17))
			for range 40 {
				if rng.IntN(10) == 0 {
					require.NoError(t, g.Reconfigure(cfg(rng)))
				}
				n, model := 1+rng.IntN(40), fmt.Sprint("m", rng.IntN(3))
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					go cancel()
				}
				gt, err := g.AcquireN(ctx, model, n)
				cancel()
				if err != nil {
					var le *slots.LimitError
					if !errors.As(err, &le) && !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error: %v", err)
					}
					refused.Add(1)
					continue
				}
				admitted.Add(1)
				if got := total.Add(int64(n)); got > 100 {
					t.Errorf("%d tokens in flight, over 100", got)
				}
				if model == "m0" {
					if got := model0.Add(int64(n)); got > 50 {
						t.Errorf("m0: %d tokens in flight, over 50", got)
					}
				}
				if rng.IntN(2) == 0 {
					runtime.Gosched() // the request's work
				}
				if model == "m0" {
					model0.Add(-int64(n))
				}
				total.Add(-int64(n))
				gt.Slot.Release()
			}
		})
	}
	wg.Wait()
	st := g.Status()
	assert.Equal(t, 0, st.Tokens)
	assert.Equal(t, 0, st.InFlight)
	assert.Equal(t, 0, st.Queued)
	assert.Positive(t, admitted.Load())
	t.Logf("%d admitted, %d refused", admitted.Load(), refused.Load())
}

// A token count out of range is refused by the Transport before any wait,
// and the upstream never sees the request.
func TestTransportRefusesABadTokenCount(t *testing.T) {
	g := newGate(t, pacing.Config{MaxInflightTokens: 100})
	var sent atomic.Int32
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		sent.Add(1)
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
	})
	client := &http.Client{Transport: pacing.NewTransport(base, g)}
	for _, n := range []int{0, -5} {
		ctx := pacing.WithModelName(pacing.WithTokens(context.Background(), pacing.Tokens{Input: n}), "m")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.test/v1/chat/completions", nil)
		require.NoError(t, err)
		_, err = client.Do(req)
		assert.ErrorIs(t, err, slots.ErrBadUnits)
	}
	assert.Zero(t, sent.Load())
	assert.Equal(t, 0, g.Status().InFlight)
}
