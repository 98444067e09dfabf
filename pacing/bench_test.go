package pacing_test

import (
	"context"
	"testing"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// BenchmarkGateAcquireRelease is the uncontended cost of a Gate's
// admission (a provider cap of 8, no pacing), beside a Limiter's, the
// floor of any admission with a Slot; "tokens" weighs each request 10 of a
// token cap of 1,000; "budget" charges each 30 tokens of a budget per
// minute that never binds, and settles it with 15; "requests-budget"
// counts each on a budget of requests per minute that never binds.
func BenchmarkGateAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("gate", func(b *testing.B) {
		g, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 8})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			gt, err := g.Acquire(ctx, "m")
			if err != nil {
				b.Fatal(err)
			}
			gt.Slot.Release()
		}
	})
	b.Run("gate-tokens", func(b *testing.B) {
		g, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 8, MaxInflightTokens: 1000})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			gt, err := g.AcquireN(ctx, "m", 10)
			if err != nil {
				b.Fatal(err)
			}
			gt.Slot.Release()
		}
	})
	b.Run("gate-budget", func(b *testing.B) {
		g, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 8, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1 << 60}})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			gt, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 10, Output: 20})
			if err != nil {
				b.Fatal(err)
			}
			g.Settle(gt, pacing.Tokens{Input: 10, Output: 5})
			gt.Slot.Release()
		}
	})
	b.Run("gate-requests-budget", func(b *testing.B) {
		g, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 8, BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1 << 60}})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			gt, err := g.Acquire(ctx, "m")
			if err != nil {
				b.Fatal(err)
			}
			gt.Slot.Release()
		}
	})
	b.Run("limiter", func(b *testing.B) {
		l := slots.NewLimiter(8)
		b.ReportAllocs()
		for b.Loop() {
			s, err := l.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
		}
	})
}
