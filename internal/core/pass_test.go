package core_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
)

// unitsWaiter returns a waiter of n units, of class c, in flow id.
func unitsWaiter(c uint8, id string, n int) *core.Waiter {
	w := core.NewWaiter(&core.Hold{Class: c, Extra: int32(n - 1)}, 0)
	w.Place(core.Place{Flow: id, Weight: 1})
	return w
}

// A blocker is passed by the waiters of its flow until they took
// PassFactor times its units, by those of another flow or class until
// they took half its units; then nobody passes it, and it is served first
// once its units are free.
func TestCandidatePassesABlockerUpToItsBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		class   uint8
		flow    string
		passers int // callers of one unit that pass a blocker of 4
	}{
		{"its flow", core.ClassDefault, "", 4 * core.PassFactor},
		{"another flow", core.ClassDefault, "b", 2},
		{"another class", core.ClassLow, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := core.Lane{Limit: 10}
			held := unitsWaiter(core.ClassDefault, "", 8)
			ln.Holders.Add(held.Hold, &held.Hold.Idx)
			b := unitsWaiter(core.ClassDefault, "", 4)
			ln.Waiters.Push(&b.Elem)
			for i := range tc.passers {
				p := unitsWaiter(tc.class, tc.flow, 1)
				ln.Waiters.Push(&p.Elem)
				got := serve(&ln)
				require.Same(t, p, got, "passer %d", i+1)
				release(&ln, got)
			}
			last := unitsWaiter(tc.class, tc.flow, 1)
			ln.Waiters.Push(&last.Elem)
			assert.Nil(t, serve(&ln), "2 units free, kept for the blocker past its bound")
			release(&ln, held)
			assert.Same(t, b, serve(&ln), "its units are free: it goes first")
			assert.Same(t, last, serve(&ln))
		})
	}
}

// A search looks at most PassScan waiters past the first blocker: a
// waiter that fits further back waits for its own turn.
func TestCandidateLooksAtMostPassScanPastABlocker(t *testing.T) {
	ln := core.Lane{Limit: 10}
	held := unitsWaiter(core.ClassDefault, "", 8)
	ln.Holders.Add(held.Hold, &held.Hold.Idx)
	ln.Waiters.Push(&unitsWaiter(core.ClassDefault, "", 4).Elem)
	for range core.PassScan {
		ln.Waiters.Push(&unitsWaiter(core.ClassDefault, "", 3).Elem) // none fits
	}
	far := unitsWaiter(core.ClassDefault, "", 1)
	ln.Waiters.Push(&far.Elem)
	w, _ := ln.Candidate(nil)
	assert.Nil(t, w, "the one that fits is waiter %d past the blocker", core.PassScan+1)
	ln.Waiters.Remove(&ln.Waiters.Head(core.ClassDefault).Value.Elem)
	w, passed := ln.Candidate(nil)
	assert.Same(t, far, w, "one blocker fewer: it is within the scan")
	assert.NotNil(t, passed)
}

// Past the scan's bound, a class owed its share (Short) is still served,
// as it is past a blocker that keeps its place: batch's Min of 2 reaches
// its caller of one unit whether 63 or 64 waiters stand between.
func TestCandidateServesOwedClassesPastTheScan(t *testing.T) {
	for _, behind := range []int{core.PassScan - 1, core.PassScan} {
		ln := core.Lane{Limit: 10, Shares: &core.Shares{Min: [core.NumClasses]int{core.ClassLow: 2}}}
		held := unitsWaiter(core.ClassHigh, "", 7)
		ln.Holders.Add(held.Hold, &held.Hold.Idx)
		ln.Waiters.Push(&unitsWaiter(core.ClassHigh, "", 4).Elem)
		for range behind {
			ln.Waiters.Push(&unitsWaiter(core.ClassHigh, "", 4).Elem)
		}
		low := unitsWaiter(core.ClassLow, "", 1)
		ln.Waiters.Push(&low.Elem)
		w, _ := ln.Candidate(nil)
		assert.Same(t, low, w, "%d behind the blocker", behind)
	}
}
