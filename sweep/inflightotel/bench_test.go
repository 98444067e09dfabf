package inflightotel_test

import (
	"context"
	"testing"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// BenchmarkAdmission: Acquire and Release under a context without a span,
// with no MeterProvider installed, beside the same without an Observer and
// with an Observer that does nothing (the floor of any Observer): what the
// adapter adds to an admission when nothing is traced or collected.
func BenchmarkAdmission(b *testing.B) {
	c, err := inflightotel.New("provider")
	if err != nil {
		b.Fatal(err)
	}
	nop := slots.ObserverFunc(func(slots.Event) {})
	ctx := slots.WithPriority(context.Background(), slots.PriorityBatch)
	for _, tc := range []struct {
		name string
		opts []slots.Option
	}{
		{"bare", nil},
		{"nop-observer", []slots.Option{slots.WithObserver(nop)}},
		{"inflightotel", []slots.Option{slots.WithObserver(c)}},
	} {
		b.Run("limiter/"+tc.name, func(b *testing.B) {
			l := slots.NewLimiter(8, tc.opts...)
			b.ReportAllocs()
			for b.Loop() {
				s, err := l.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				s.Release()
			}
		})
		b.Run("registry/"+tc.name, func(b *testing.B) {
			r := registry.New[string](8, tc.opts...)
			b.ReportAllocs()
			for b.Loop() {
				s, err := r.Acquire(ctx, "org-a")
				if err != nil {
					b.Fatal(err)
				}
				s.Release()
			}
		})
	}
}
