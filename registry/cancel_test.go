package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

func TestRegistryNeverAdmitsAnEndedContext(t *testing.T) {
	acquire := map[string]func(*registry.Registry[string], context.Context) (*slots.Slot, error){
		"Acquire": func(r *registry.Registry[string], ctx context.Context) (*slots.Slot, error) {
			return r.Acquire(ctx, "a")
		},
		"AcquireAll": func(r *registry.Registry[string], ctx context.Context) (*slots.Slot, error) {
			return r.AcquireAll(ctx, "a", "b")
		},
	}
	for name, acquire := range acquire {
		t.Run(name+": the context ends while the key's limit is looked up", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			fetch := func(context.Context, string) (int, error) {
				cancel()
				return 1, nil
			}
			reg := registry.NewWithLimitFunc[string](1, fetch, time.Minute)
			s, err := acquire(reg, ctx)
			assert.ErrorIs(t, err, context.Canceled, "a free slot is not given to a caller that has given up")
			assert.Nil(t, s)
			assert.Zero(t, reg.InFlight("a"))
			assert.Zero(t, reg.Keys())
		})
		t.Run(name+": the context ends as its class is read", func(t *testing.T) {
			reg := registry.New[string](1, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
			s, err := acquire(reg, testrig.EndsOnLookup())
			assert.ErrorIs(t, err, context.Canceled)
			assert.Nil(t, s)
			assert.Zero(t, reg.Keys())
			assert.Equal(t, uint64(0), reg.Stats().Acquired)
		})
	}
}
