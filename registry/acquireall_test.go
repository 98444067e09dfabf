package registry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Every rejection of a multi-key admission names the key that was full.
func TestAcquireAllNamesTheFullKey(t *testing.T) {
	cases := []struct {
		name string
		opts []registry.Option
		call func(*registry.Registry[string]) error
		want error
	}{
		{"TryAcquireAll", nil, func(r *registry.Registry[string]) error {
			_, err := r.TryAcquireAll("a", "b", "c")
			return err
		}, slots.ErrLimitReached},
		{"AcquireAll with no queue", []registry.Option{registry.WithMaxQueue(0)}, func(r *registry.Registry[string]) error {
			_, err := r.AcquireAll(context.Background(), "a", "b", "c")
			return err
		}, slots.ErrQueueFull},
		{"AcquireAll past its maximum wait", []registry.Option{registry.WithMaxWait(time.Millisecond)}, func(r *registry.Registry[string]) error {
			_, err := r.AcquireAll(context.Background(), "a", "b", "c")
			return err
		}, slots.ErrWaitTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := registry.New[string](1, tc.opts...)
			held, err := reg.TryAcquire("b")
			require.NoError(t, err)
			err = tc.call(reg)
			require.ErrorIs(t, err, tc.want)
			var le *slots.LimitError
			require.True(t, errors.As(err, &le))
			assert.Equal(t, "b", le.Key)
			assert.Equal(t, 1, le.InFlight)
			assert.Equal(t, 1, le.Limit)
			held.Release()
			assert.Zero(t, reg.Keys(), "a rejection leaves nothing behind")
		})
	}
}
