package pacing_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

func gateAcquirer(g *pacing.Gate, model string) func(context.Context) (*slots.Slot, error) {
	return func(ctx context.Context) (*slots.Slot, error) {
		gt, err := g.Acquire(ctx, model)
		return gt.Slot, err
	}
}

var (
	interactive = slots.WithPriority(context.Background(), slots.PriorityInteractive)
	batch       = slots.WithPriority(context.Background(), slots.PriorityBatch)
)

// Provider cap 4 saturated by batch with 100 batch requests queued: an
// interactive request starts at the next release.
func TestGateInteractiveJumpsBatch(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 4, MaxQueue: 1000})
		b := testrig.New(t, gateAcquirer(g, "glm-5.3"))
		for range 104 {
			b.Add(batch, "batch")
		}
		i := testrig.New(t, gateAcquirer(g, "glm-4"))
		i.Add(interactive, "interactive")
		st := g.Status()
		assert.Equal(t, 100, st.Queue.Batch)
		assert.Equal(t, 1, st.Queue.Interactive)
		b.ReleaseOldest()
		assert.Equal(t, []string{"interactive"}, i.Order())
		i.ReleaseAll()
		b.ReleaseAll()
		assert.Zero(t, g.Status().InFlight)
	})
}

// Pacing and turns together: starts stay spaced, and flow B's one request
// is among the next two starts after flow A queued 50.
func TestGateFlowsTakeTurnsUnderPacing(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 100, RequestsPerMinute: 600, MaxQueue: 1000})
		r := testrig.New(t, gateAcquirer(g, "m"))
		a := slots.WithFlow(context.Background(), "A")
		for range 51 {
			r.Add(a, "A")
		}
		r.Add(slots.WithFlow(context.Background(), "B"), "B")
		require.Equal(t, []string{"A"}, r.Order(), "one start; the rest wait for their turn")
		start := time.Now()
		for len(r.Order()) < 3 {
			time.Sleep(100 * time.Millisecond) // fake time: the next start is 100 ms later
			synctest.Wait()
		}
		assert.Equal(t, 200*time.Millisecond, time.Since(start), "two more starts, 100 ms apart")
		assert.Contains(t, r.Order()[1:3], "B")
		g.Close()
		r.ReleaseAll()
	})
}

// Shares and a per-flow queue bound from the config.
func TestGateSharesAndFlowQueue(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg, err := pacing.Parse([]byte(`{"max_concurrent_requests":2,"max_queue_per_flow":1,
			"shares":{"interactive":{"reserved":1}}}`))
		require.NoError(t, err)
		g := newGate(t, cfg)
		r := testrig.New(t, gateAcquirer(g, "m"))
		r.Add(context.Background(), "default")
		acme := slots.WithFlow(context.Background(), "acme")
		r.Add(acme, "acme") // the second slot is interactive's: it waits
		r.Add(acme, "acme") // acme's second waiter: over its bound
		r.Add(slots.WithFlow(context.Background(), "zeta"), "zeta")
		require.Len(t, r.Errs(), 1)
		assert.ErrorIs(t, r.Errs()[0], slots.ErrQueueFull)
		assert.Equal(t, 2, g.Status().Queued)

		r.Add(interactive, "interactive")
		assert.Equal(t, []string{"default", "interactive"}, r.Order(), "the reserve is interactive's")
		r.ReleaseAll()
		assert.Equal(t, []string{"default", "interactive", "acme", "zeta"}, r.Order())
	})
}

// TestPerFlowBoundZeroMeansNoneWait: max_queue_per_flow 0 means what
// slots.WithMaxQueuePerFlow(0) means, that none of a flow's requests may
// wait (a request that cannot start at once is refused); left out, only
// max_queue bounds the flow. A Limiter under the same bound answers alike.
func TestPerFlowBoundZeroMeansNoneWait(t *testing.T) {
	acme := slots.WithFlow(context.Background(), "acme")
	admit := func(t *testing.T, acquire func(context.Context) (*slots.Slot, error)) error {
		t.Helper()
		held, err := acquire(acme)
		require.NoError(t, err, "the first starts at once")
		defer held.Release()
		ctx, cancel := context.WithTimeout(acme, 10*time.Millisecond)
		defer cancel()
		s, err := acquire(ctx) // the cap is full: it would have to wait
		if err == nil {
			s.Release()
		}
		return err
	}
	testrig.Bubble(t, func(t *testing.T) {
		for _, c := range []struct {
			json string
			want error
		}{
			{`{"max_concurrent_requests":1,"max_queue_per_flow":0}`, slots.ErrQueueFull},
			{`{"max_concurrent_requests":1}`, slots.ErrWaitTimeout},
		} {
			cfg, err := pacing.Parse([]byte(c.json))
			require.NoError(t, err)
			cfg.MaxQueueWaitMS = 5
			g := newGate(t, cfg)
			err = admit(t, func(ctx context.Context) (*slots.Slot, error) {
				gr, err := g.Acquire(ctx, "m")
				return gr.Slot, err
			})
			assert.ErrorIs(t, err, c.want, "gate %s", c.json)
		}
		lim := slots.NewLimiter(1, slots.WithMaxQueuePerFlow(0), slots.WithMaxWait(5*time.Millisecond))
		assert.ErrorIs(t, admit(t, lim.Acquire), slots.ErrQueueFull, "a Limiter with WithMaxQueuePerFlow(0)")
	})
}

func TestConfigSharesValidate(t *testing.T) {
	for _, bad := range []string{
		`{"shares":{"urgent":{"min":1}}}`,
		`{"shares":{"batch":{"min":-1}}}`,
		`{"shares":{"batch":{"reserved":-1}}}`,
		`{"max_queue_per_flow":-1}`,
	} {
		_, err := pacing.Parse([]byte(bad))
		assert.Error(t, err, bad)
	}
}

// shares.batch.min = 1 under sustained interactive load: every fourth grant
// is batch's, as on a Limiter and a Registry.
func TestGateBatchMinShare(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg, err := pacing.Parse([]byte(`{"max_concurrent_requests":4,"max_queue":1000,
			"shares":{"batch":{"min":1}}}`))
		require.NoError(t, err)
		g := newGate(t, cfg)
		r := testrig.New(t, gateAcquirer(g, "m"))
		r.CheckMinShare(interactive, batch)
		g.Close()
		r.ReleaseAll()
	})
}
