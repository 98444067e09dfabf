package memstore

import (
	"context"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Budget charges, corrects or checks a budget per minute: one map of
// steps per budget, its counts per part.
func (s *Store) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	if err := s.enter(ctx); err != nil {
		return driver.BudgetResult{}, err
	}
	defer s.mu.Unlock()
	now, _ := s.now()
	s.swept(now)
	steps := s.data.budgets[c.Key]
	if steps == nil {
		steps = map[int64][3]int64{}
		s.data.budgets[c.Key] = steps
	}
	// A clock set back does not move the window back: it stays at the
	// latest step charged.
	cur := now / 1000
	for st := range steps {
		cur = max(cur, st)
	}
	first := cur - driver.BudgetSteps
	var used [3]int64
	for st, n := range steps {
		if st < first {
			delete(steps, st)
			continue
		}
		for i := range used {
			used[i] += n[i]
		}
	}
	res := driver.BudgetResult{Now: now, Step: cur}
	// add adds cost to step st, and to what the window counts, taking no
	// part below zero (what a lost store forgot is not given back), and
	// writes nothing for no change.
	add := func(st int64, cost [3]int64) {
		was := steps[st]
		n := was
		for i, d := range cost {
			n[i] = max(n[i]+d, 0)
			used[i] += n[i] - was[i]
		}
		if n != was {
			steps[st] = n
		}
	}
	// fitAt tells when c.Cost fits (0: now), and the part that binds then.
	fitAt := func() (int64, int) {
		counts := make([][3]int64, driver.BudgetSteps+1)
		for st, n := range steps {
			counts[st-first] = n
		}
		return driver.FitAt(c.Limits, c.Cost, first, counts)
	}
	switch {
	case c.Check:
		res.At, res.Binding = fitAt()
	case c.Correct && c.Move:
		if c.Step != cur {
			if c.Step >= first {
				add(c.Step, [3]int64{-c.Cost[0], -c.Cost[1], -c.Cost[2]})
			}
			add(cur, c.Cost)
		}
		res.Charged = true
	case c.Correct:
		at := c.Step
		if at < first || at > cur {
			at = cur // a debt, or nothing to return
		}
		var cost [3]int64
		for i, d := range c.Cost {
			if at == c.Step || d > 0 {
				cost[i] = d
			}
		}
		add(at, cost)
		res.Charged = true
	case driver.Fits(c.Limits, used, c.Cost):
		add(cur, c.Cost)
		res.Charged = true
	default:
		res.At, res.Binding = fitAt()
	}
	if len(steps) == 0 {
		delete(s.data.budgets, c.Key)
	}
	res.Used = used
	return res, nil
}
