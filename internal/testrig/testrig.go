// Package testrig records the order in which queued callers are granted, for
// the tests of the packages that queue them. Use it inside a
// testing/synctest bubble.
package testrig

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// Rig starts callers one at a time (each is granted or queued before the
// next starts) and records the order of their grants.
type Rig struct {
	t       testing.TB
	acquire func(context.Context) (*slots.Slot, error)

	mu      sync.Mutex
	granted []string      // labels, in grant order
	held    []*slots.Slot // in grant order; released oldest first
	errs    []error
}

// New returns a Rig whose callers run acquire.
func New(t testing.TB, acquire func(context.Context) (*slots.Slot, error)) *Rig {
	return &Rig{t: t, acquire: acquire}
}

// Add starts a caller with ctx, labelled label, and returns once it is
// granted, queued or refused.
func (r *Rig) Add(ctx context.Context, label string) {
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
func (r *Rig) ReleaseOldest() {
	r.mu.Lock()
	require.NotEmpty(r.t, r.held, "nothing held")
	s := r.held[0]
	r.held = r.held[1:]
	r.mu.Unlock()
	s.Release()
	synctest.Wait()
}

// ReleaseAll releases every held slot, oldest first, until none is held.
func (r *Rig) ReleaseAll() {
	for r.Held() > 0 {
		r.ReleaseOldest()
	}
}

// Held returns how many slots the rig's callers hold.
func (r *Rig) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// Order returns the labels of the granted callers, in grant order.
func (r *Rig) Order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.granted...)
}

// Errs returns the errors of the refused callers, in order.
func (r *Rig) Errs() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}
