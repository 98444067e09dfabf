package pacing

// The changes of the learned caps, and their delivery to OnLimitChange.

import "github.com/inflight-go/inflight/internal/core"

// Evidence is the answer behind a change of the learned cap: its Kind, and
// how many were in flight when its request started.
type Evidence struct {
	Kind     Kind
	InFlight int // in flight at the request's start, itself included
}

// MaxPendingChanges bounds the changes queued for an OnLimitChange hook
// that has not returned: past it, the oldest queued is dropped.
const MaxPendingChanges = 1024

// redispatchLocked dispatches after a change of limits, unlocks, wakes the
// waiters in wk (granted or refused under the lock, by the caller too) and
// the ones it grants, and delivers the changes made (unless another caller
// is delivering them): the waiters are woken before the hook runs, so that
// a hook that panics or blocks cannot strand them.
func (g *Gate) redispatchLocked(now int64, wk *core.Wakes) {
	g.dispatchLocked(now, wk)
	deliver := len(g.ad.pending) > 0 && !g.ad.delivering
	if deliver {
		g.ad.delivering = true
	}
	g.mu.Unlock()
	wk.Wake()
	if deliver {
		g.deliver()
	}
}

// deliver calls the hook with the pending changes, oldest first, until
// none is left. Only the caller that set g.ad.delivering runs it, so the
// hook sees the changes in the order they were made, one call at a time;
// changes made meanwhile, by the hook too, join the queue and are
// delivered by this loop. If the hook panics, the next change made
// delivers the rest.
func (g *Gate) deliver() {
	done := false
	defer func() {
		if !done {
			g.mu.Lock()
			g.ad.delivering = false
			g.mu.Unlock()
		}
	}()
	for {
		g.mu.Lock()
		f := g.ad.onChange
		if len(g.ad.pending) == 0 || f == nil {
			g.ad.pending = nil
			g.ad.delivering = false
			g.mu.Unlock()
			done = true
			return
		}
		c := g.ad.pending[0]
		g.ad.pending = g.ad.pending[1:]
		g.mu.Unlock()
		f(c)
	}
}

// LimitChange is a change of a Gate's learned cap or of its ceiling, with
// the evidence behind it. An Evidence of Kind Other and InFlight 0 is the
// passing of time (probes taken as admitted, a retest due) or a
// Reconfigure.
type LimitChange struct {
	// Seq numbers the Gate's changes in the order they were made, from 1,
	// over all of its learned caps; changes made while no hook was set
	// take their numbers too.
	Seq                 uint64
	Provider            string
	Model               string // the model whose cap it is, if a model's
	Key                 string // the API key whose cap it is, if a key's
	OldCap, Cap         int
	OldCeiling, Ceiling int
	Evidence            Evidence
}

// OnLimitChange sets f to be called with each change of a learned cap or
// ceiling made from then on (nil: none), for events and metrics; changes
// made before it and not delivered yet go to f too.
//
// f is called after the Gate's lock is released, so it may call the Gate's
// methods, and one call at a time, in the order of LimitChange.Seq. The
// calls run on the goroutine of a call that made a change (a Report, a
// Reconfigure, a timer of the Gate's); while one goroutine delivers, the
// changes that others make are queued for it, and they return without
// waiting for f. So f should return quickly: it delays the request whose
// answer is being delivered (and that request's goroutine delivers what the
// others queue meanwhile), and a call of f that blocks holds back every
// later change; at most MaxPendingChanges wait, the newest, and the gaps in
// Seq show what was dropped. A panic of f goes up to the caller that was
// delivering, or, on a timer of the Gate's, is logged. After OnLimitChange
// returns, a call of the previous hook may still be under way, but none
// starts.
func (g *Gate) OnLimitChange(f func(LimitChange)) {
	g.mu.Lock()
	g.ad.onChange = f
	if f == nil {
		g.ad.pending = nil
	}
	g.mu.Unlock()
}
