package registry_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// A key whose whole limit a higher class's Reserved takes is paused for a
// lower class, as a limit of 0 is: its AcquireAll waiters of one unit
// wait, however often passed over, and keep nothing of their other keys,
// until the limit is raised. Before, once passed over MaxPassed times they
// kept a unit each of the provider key: as many of them as its room
// stopped every other model of their class on an idle provider (left by a
// review; a bug hunt found the single-key side).
func TestKeyShutOutByAReserveIsAPause(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](4, slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 2}))
		reg.SetLimit("m1", 2) // all of it reserved for interactive callers
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		const waiters = 3 // more than the default class's room on p (2 of 4)
		served := make(chan error, waiters)
		for range waiters {
			go func() {
				s, err := reg.AcquireAll(ctx, "p", "m1")
				if err == nil {
					s.Release()
				}
				served <- err
			}()
		}
		synctest.Wait()
		require.Equal(t, waiters, reg.Waiting("m1"), "waiting, not refused")
		for i := range 3 * registry.MaxPassed {
			s, err := reg.TryAcquireAll("p", "m2")
			require.NoError(t, err, "admission %d of p and m2 beside the paused waiters", i+1)
			s.Release()
		}
		var held []*slots.Slot
		for i := range 2 { // the default class's whole room on p
			s, err := reg.TryAcquireAll("p", "m2")
			require.NoError(t, err, "p's unit %d of 2", i+1)
			held = append(held, s)
		}
		for _, s := range held {
			s.Release()
		}

		reg.SetLimit("m1", 4)
		for range waiters {
			assert.NoError(t, <-served, "served once the limit is raised")
		}
		assert.Zero(t, reg.Keys())
	})
}
