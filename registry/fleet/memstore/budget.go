package memstore

import (
	"context"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Budget charges or corrects a budget per minute: one map of steps per
// budget, its counts per part.
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
	switch {
	case c.Correct && c.Move:
		if c.Step != cur {
			if n, ok := steps[c.Step]; ok && c.Step >= first {
				for i, d := range c.Cost {
					n[i] -= d
					used[i] -= d
				}
				steps[c.Step] = n
			}
			n := steps[cur]
			for i, d := range c.Cost {
				n[i] += d
				used[i] += d
			}
			steps[cur] = n
		}
		res.Charged = true
	case c.Correct:
		at := c.Step
		if at < first || at > cur {
			at = cur // a debt, or nothing to return
		}
		n, add := steps[at], false
		for i, d := range c.Cost {
			if at == c.Step || d > 0 {
				n[i] += d
				used[i] += d
				add = add || d != 0
			}
		}
		if add { // a correction of zero (a read) writes nothing
			steps[at] = n
		}
		res.Charged = true
	case driver.Fits(c.Limits, used, c.Cost):
		n := steps[cur]
		for i, d := range c.Cost {
			n[i] += d
			used[i] += d
		}
		steps[cur] = n
		res.Charged = true
	default:
		counts := make([][3]int64, driver.BudgetSteps+1)
		for st, n := range steps {
			counts[st-first] = n
		}
		res.At, res.Binding = driver.FitAt(c.Limits, c.Cost, first, counts)
	}
	if len(steps) == 0 {
		delete(s.data.budgets, c.Key)
	}
	res.Used = used
	return res, nil
}
