package pgstore

import (
	"context"
	"time"
)

// sweep sweeps the rows of idle keys (sweep.sql) after a renewal, in a
// transaction of its own, under the renewal's deadline; not when the pool
// has no idle connection or the deadline is near (a struggling store: a
// call cut by its deadline costs a connection), nor after a failed
// renewal. A sweep not made, or that fails, is a later one's to do.
func (s *Store) sweep(ctx context.Context) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) < sweepMargin || s.pool.Stat().IdleConns() == 0 {
		return
	}
	_, _ = s.pool.Exec(ctx, "SELECT inflight_sweep_keys($1)", s.name)
}

// sweepMargin is how much of a renewal's time must be left for a sweep.
const sweepMargin = 100 * time.Millisecond
