package pacing

import (
	"sync"

	"github.com/benbjohnson/clock"
)

// Budgets keeps a Budget per key (an org, a tenant: a budget of the
// program's own, beside a Gate's), each made with the limits limitsOf
// gives when its key first reserves, and dropped once it is idle and none
// of its reservations is open, so that memory follows the keys in use
// (keys from request headers cannot pile up). Safe for concurrent use;
// create it with NewBudgets.
//
// A reservation stays open until Settle, Cancel or Close ends it: its key's
// Budget is kept meanwhile, so a request longer than a minute settles into
// the Budget it reserved from, and an underestimate is charged as debt
// there. End every reservation; one never ended keeps its key's Budget.
type Budgets[K comparable] struct {
	limitsOf func(K) *BudgetLimits
	clk      clock.Clock // nil: the real clock

	mu      sync.Mutex
	live    map[K]*keyedBudget
	pruneAt int // the idle ones are dropped once live has this many
}

// keyedBudget is a key's Budget and how many of its reservations are open.
type keyedBudget struct {
	b    *Budget
	open int // guarded by Budgets.mu
}

// minPrune is how many Budgets are kept before the idle ones are dropped.
const minPrune = 1024

// NewBudgets returns Budgets whose key k has the limits limitsOf(k) (nil:
// k has no budget), read when k's Budget is made: a change takes effect
// once the key has been idle. The clock is the real one, or clk (a mock,
// in tests) when given.
func NewBudgets[K comparable](limitsOf func(K) *BudgetLimits, clk ...clock.Clock) *Budgets[K] {
	s := &Budgets[K]{limitsOf: limitsOf, live: map[K]*keyedBudget{}, pruneAt: minPrune}
	if len(clk) > 0 {
		s.clk = clk[0]
	}
	return s
}

// Reserve reserves t of key's Budget, as Budget.Reserve does; a key
// without a budget reserves nothing (a nil Reservation, whose methods do
// nothing, and no error). Limits that NewBudget refuses are its error.
func (s *Budgets[K]) Reserve(key K, t Tokens) (*Reservation, error) {
	limits := s.limitsOf(key)
	if limits == nil {
		return nil, nil
	}
	s.mu.Lock()
	e := s.live[key]
	if e == nil {
		b, err := NewBudget(*limits, s.clk)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.pruneLocked()
		e = &keyedBudget{b: b}
		s.live[key] = e
	}
	e.open++
	s.mu.Unlock()
	r, err := e.b.Reserve(t)
	if err != nil {
		s.end(e)
		return nil, err
	}
	r.ended = func() { s.end(e) }
	return r, nil
}

func (s *Budgets[K]) end(e *keyedBudget) {
	s.mu.Lock()
	e.open--
	s.mu.Unlock()
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
