package core_test

import (
	"testing"

	"github.com/inflight-go/inflight/internal/core"
)

// laneState is a small lane: its limit, shares, holders per class and which
// classes wait.
type laneState struct {
	limit   int
	sh      core.Shares
	hold    [core.NumClasses]int
	waiting [core.NumClasses]bool
}

// statePool keeps the holds and waiters a lane is built from, so that the
// exhaustive checks below allocate little.
type statePool struct {
	holds   [core.NumClasses][8]core.Hold
	waiters [core.NumClasses]*core.Waiter
}

func newStatePool() *statePool {
	p := &statePool{}
	for c := range core.NumClasses {
		for i := range p.holds[c] {
			p.holds[c][i].Class = c
		}
		p.waiters[c] = waiter(c, "", 0)
	}
	return p
}

func (p *statePool) lane(s laneState) *core.Lane {
	ln := &core.Lane{Limit: s.limit, Shares: &s.sh}
	for c := range core.NumClasses {
		for i := range s.hold[c] {
			h := &p.holds[c][i]
			ln.Holders.Add(h, &h.Idx)
		}
		if s.waiting[c] {
			w := p.waiters[c]
			ln.Waiters.Push(&w.Elem)
		}
	}
	return ln
}

// servable reports whether some waiting class may take a slot.
func (p *statePool) servable(s laneState) bool {
	ln := p.lane(s)
	for c := range core.NumClasses {
		if s.waiting[c] && ln.CanTake(c, 1) {
			return true
		}
	}
	return false
}

// eachState calls f for every lane state with limit <= 4, Min <= 2,
// Reserved <= 1 and holders <= 2 per class.
func eachState(f func(laneState)) {
	var s laneState
	for s.limit = 0; s.limit <= 4; s.limit++ {
		for m := range 27 {
			s.sh.Min = [3]int{m % 3, m / 3 % 3, m / 9}
			for r := range 8 {
				s.sh.Reserved = [3]int{r & 1, r >> 1 & 1, r >> 2}
				for h := range 27 {
					s.hold = [3]int{h % 3, h / 3 % 3, h / 9}
					for w := range 8 {
						s.waiting = [3]bool{w&1 != 0, w&2 != 0, w&4 != 0}
						f(s)
					}
				}
			}
		}
	}
}

// Over every small lane state where no waiting class may take a slot (what
// the owners' dispatch leaves behind):
//   - the free slots are no more than the idle classes' reserves: nothing
//     else is left unused while someone waits;
//   - admitting a newcomer, queueing a waiter, or lowering the limit leaves
//     it so, which is why those events need no dispatch;
//   - and with no shares set (all zero) a class may take whenever there is
//     room.
func TestSharesFixpoint(t *testing.T) {
	p := newStatePool()
	states, bad := 0, 0
	fail := func(format string, args ...any) {
		if bad++; bad <= 5 {
			t.Errorf(format, args...)
		}
	}
	eachState(func(s laneState) {
		if p.servable(s) {
			return
		}
		states++
		free := s.limit - s.hold[0] - s.hold[1] - s.hold[2]
		anyWaiting := s.waiting[0] || s.waiting[1] || s.waiting[2]
		if anyWaiting && free > 0 {
			left, reserves := s.limit, 0
			for _, d := range core.Order {
				g := min(s.sh.Reserved[d], left)
				if s.waiting[d] {
					g = min(max(s.sh.Min[d], s.sh.Reserved[d]), left)
				}
				left -= g
				if !s.waiting[d] {
					reserves += max(0, g-s.hold[d])
				}
			}
			if free > reserves {
				fail("free %d > idle reserves %d while waiting: %+v", free, reserves, s)
			}
			if s.sh == (core.Shares{}) {
				fail("room and no shares, yet nobody may take: %+v", s)
			}
		}
		ln := p.lane(s)
		for c := range core.NumClasses {
			if s.waiting[c] {
				continue
			}
			a := s
			if ln.CanTake(c, 1) && s.hold[c] < 2 {
				a.hold[c]++ // a newcomer of c is admitted
				if p.servable(a) {
					fail("admitting a class %d newcomer unblocks a waiter: %+v", c, s)
				}
			} else if !ln.CanTake(c, 1) {
				a.waiting[c] = true // a newcomer of c queues
				if p.servable(a) {
					fail("queueing a class %d waiter unblocks a waiter: %+v", c, s)
				}
			}
		}
		if s.limit > 0 {
			a := s
			a.limit--
			if p.servable(a) {
				fail("lowering the limit unblocks a waiter: %+v", s)
			}
		}
	})
	t.Logf("%d states at a fixpoint checked", states)
}

// Over every small lane state, n units are admitted exactly when n
// admissions of one unit in a row would be (the class counting as waiting
// throughout), and Capacity is the most units a class can take from an
// empty lane while every other class waits.
func TestSharesUnitsAsSteps(t *testing.T) {
	p := newStatePool()
	checked, bad := 0, 0
	eachState(func(s laneState) {
		for c := range core.NumClasses {
			ln := p.lane(s)
			a := s
			for n := 1; n <= 4; n++ {
				if !p.lane(a).CanTake(c, 1) {
					for ; n <= 4; n++ {
						if ln.CanTake(c, n) {
							if bad++; bad <= 5 {
								t.Errorf("class %d may take %d units at once but not one at a time: %+v", c, n, s)
							}
						}
					}
					break
				}
				a.hold[c]++
				if !ln.CanTake(c, n) {
					if bad++; bad <= 5 {
						t.Errorf("class %d may take %d units one at a time but not at once: %+v", c, n, s)
					}
				}
				checked++
			}
		}
		if s.hold != [core.NumClasses]int{} || s.waiting != [core.NumClasses]bool{true, true, true} {
			return
		}
		for c := range core.NumClasses {
			ln := p.lane(s)
			most := 0
			for n := 1; n <= s.limit; n++ {
				if ln.CanTake(c, n) {
					most = n
				}
			}
			if got := ln.Capacity(c); got != most {
				t.Errorf("class %d: Capacity %d, but it can take %d from an empty lane with every class waiting: %+v", c, got, most, s)
			}
		}
	})
	t.Logf("%d admissions of n units checked", checked)
}
