// Package testrig records the order in which queued callers are granted, for
// the tests of the packages that queue them. Use it inside a
// testing/synctest bubble. It imports nothing of the module, so that the
// packages it tests stay above it.
package testrig

import (
	"context"
	"math"
	"sync"
	"testing"
	"testing/synctest"
)

// A Releaser is what an admission hands out: a *slots.Slot.
type Releaser interface{ Release() bool }

// Rig starts callers one at a time (each is granted or queued before the
// next starts) and records the order of their grants.
type Rig[S Releaser] struct {
	t       testing.TB
	acquire func(context.Context) (S, error)

	mu      sync.Mutex
	granted []string // labels, in grant order
	held    []S      // in grant order; released oldest first
	errs    []error
}

// New returns a Rig whose callers run acquire.
func New[S Releaser](t testing.TB, acquire func(context.Context) (S, error)) *Rig[S] {
	return &Rig[S]{t: t, acquire: acquire}
}

// Add starts a caller with ctx, labelled label, and returns once it is
// granted, queued or refused.
func (r *Rig[S]) Add(ctx context.Context, label string) {
	go func() {
		s, err := r.acquire(ctx)
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.errs = append(r.errs, err)
			return
		}
		r.granted = append(r.granted, label)
		r.held = append(r.held, s)
	}()
	synctest.Wait()
}

// ReleaseOldest releases the longest-held slot and returns once the grants
// it makes have landed.
func (r *Rig[S]) ReleaseOldest() {
	r.mu.Lock()
	if len(r.held) == 0 {
		r.mu.Unlock()
		r.t.Fatal("testrig: nothing held")
	}
	s := r.held[0]
	r.held = r.held[1:]
	r.mu.Unlock()
	s.Release()
	synctest.Wait()
}

// ReleaseAll releases every held slot, oldest first, until none is held.
func (r *Rig[S]) ReleaseAll() {
	for r.Held() > 0 {
		r.ReleaseOldest()
	}
}

// Held returns how many slots the rig's callers hold.
func (r *Rig[S]) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// Order returns the labels of the granted callers, in grant order.
func (r *Rig[S]) Order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.granted...)
}

// Errs returns the errors of the refused callers, in order.
func (r *Rig[S]) Errs() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// CheckMinShare runs the sustained-load scenario of a minimum share of 1 on
// a cap of 4: four holders of the high class (the low class idle, its share
// lent), then 30 low and 120 high waiters, then 100 releases of the oldest
// holder. Every fourth grant must go to the low class, 25 of the 100 in all.
func (r *Rig[S]) CheckMinShare(high, low context.Context) {
	r.t.Helper()
	for range 4 {
		r.Add(high, "high")
	}
	for range 30 {
		r.Add(low, "low")
	}
	for range 120 {
		r.Add(high, "high")
	}
	for range 100 {
		r.ReleaseOldest()
	}
	got := r.Order()[4:]
	if len(got) != 100 {
		r.t.Fatalf("%d grants after the first 4, want 100", len(got))
	}
	n := 0
	for i, c := range got {
		if c == "low" {
			n++
		}
		if i%4 == 0 && c != "low" {
			r.t.Errorf("grant %d went to %s, want low", i, c)
		}
	}
	if n != 25 {
		r.t.Errorf("%d low-class grants out of 100, want 25", n)
	}
}

// CheckWeights queues one caller of a, then 400 each of a and b in turn,
// with a cap of 1, and checks that over the next 400 grants a (weight 3) and
// b (weight 1) are admitted 3:1, within 5%.
func (r *Rig[S]) CheckWeights(a, b context.Context) {
	r.t.Helper()
	r.Add(a, "A")
	for range 400 {
		r.Add(a, "A")
		r.Add(b, "B")
	}
	for range 400 {
		r.ReleaseOldest()
	}
	n := map[string]int{}
	for _, f := range r.Order()[1:401] {
		n[f]++
	}
	if ratio := float64(n["A"]) / float64(n["B"]); math.Abs(ratio-3)/3 > 0.05 {
		r.t.Errorf("grants %v: A to B %.3f, want 3 within 5%%", n, ratio)
	}
}
