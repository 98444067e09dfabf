package pacing

import (
	"sync"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/keys"
	"github.com/inflight-go/inflight/slots"
)

// Budgets keeps a Budget per key (an org, a tenant: a budget of the
// program's own, beside a Gate's), under the limits limitsOf gives at each
// of its key's reservations, and drops the idle ones with none of their
// reservations open once there are many, so that memory follows the keys
// in use (keys from request headers cannot pile up). Safe for concurrent
// use; create it with NewBudgets.
//
// A reservation stays open until Settle, Cancel or Close ends it: its key's
// Budget is kept meanwhile, so a request longer than a minute settles into
// the Budget it reserved from, and an underestimate is charged as debt
// there. End every reservation; one never ended keeps its key's Budget.
type Budgets[K comparable] struct {
	limitsOf func(K) *BudgetLimits
	clk      clock.Clock // nil: the real clock

	mu      sync.Mutex
	live    map[K]*keyedBudget[K]
	peak    int // the most entries of live since it was made (see keys.Remade)
	pruneAt int // the idle ones are dropped once live has this many
}

// keyedBudget is a key's Budget, the limits it has, and how many of its
// reservations are open.
type keyedBudget[K comparable] struct {
	s      *Budgets[K]
	b      *Budget
	limits BudgetLimits // guarded by s.mu
	open   int          // guarded by s.mu
}

// end implements ender: one of e's reservations has ended.
func (e *keyedBudget[K]) end() {
	e.s.mu.Lock()
	e.open--
	e.s.mu.Unlock()
}

// minPrune is how many Budgets are kept before the idle ones are dropped.
const minPrune = 1024

// NewBudgets returns Budgets whose key k has the limits limitsOf(k),
// asked on each Reserve under Budgets' lock (so it must be quick, and call
// no method of the Budgets): nil means k has no budget (nothing is reserved,
// from a Budget kept for k either); a change of other limits takes effect
// at that Reserve, what k's requests started in the last minute counting
// against the new ones (a plan cut from 1,000 tokens a minute to 150 after
// 100 lets 50 more through in that minute). The clock is the real one,
// unless slots.WithClock gives another (a mock, in tests). It panics if
// limitsOf is nil.
func NewBudgets[K comparable](limitsOf func(K) *BudgetLimits, opts ...slots.ClockOption) *Budgets[K] {
	if limitsOf == nil {
		panic("pacing: NewBudgets needs a function of the keys' limits")
	}
	s := &Budgets[K]{limitsOf: limitsOf, live: map[K]*keyedBudget[K]{}, pruneAt: minPrune}
	s.clk = clockOf(opts)
	return s
}

// Reserve reserves t of key's Budget, as Budget.Reserve does; a key
// without a budget reserves nothing (a nil Reservation, whose methods do
// nothing, and no error). Limits that NewBudget refuses are its error.
func (s *Budgets[K]) Reserve(key K, t Tokens) (*Reservation, error) {
	s.mu.Lock()
	limits := s.limitsOf(key) // under the lock: limits read before a change are not applied after it
	if limits == nil {
		s.mu.Unlock()
		return nil, nil
	}
	e := s.live[key]
	if e == nil {
		b, err := newBudget(*limits, s.clk)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.pruneLocked()
		e = &keyedBudget[K]{s: s, b: b, limits: *limits}
		s.live[key] = e
		s.peak = max(s.peak, len(s.live))
	} else if e.limits != *limits {
		if err := e.b.setLimits(*limits); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		e.limits = *limits
	}
	e.open++
	s.mu.Unlock()
	r, err := e.b.Reserve(t)
	if err != nil {
		e.end()
		return nil, err
	}
	r.owner = e
	return r, nil
}

// pruneLocked drops the Budgets that are idle with none open once live
// has pruneAt of them, and prunes again once as many more are live: O(1)
// per new key, amortised, however many are busy.
func (s *Budgets[K]) pruneLocked() {
	if len(s.live) < s.pruneAt {
		return
	}
	for k, e := range s.live {
		if e.open == 0 && e.b.Idle() {
			delete(s.live, k)
		}
	}
	s.pruneAt = max(2*len(s.live), minPrune)
	s.live = keys.Remade(s.live, &s.peak, minPrune) // so that a burst's memory goes with it
}

// Status returns key's budgets as Budget.Status does, or nil while key
// has no Budget kept (none, or dropped once idle: all of it left).
func (s *Budgets[K]) Status(key K) []BudgetStatus {
	s.mu.Lock()
	e := s.live[key]
	s.mu.Unlock()
	if e == nil {
		return nil
	}
	return e.b.Status()
}

// Len returns how many keys have a Budget kept now.
func (s *Budgets[K]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}
