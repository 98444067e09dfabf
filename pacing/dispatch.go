package pacing

// The Gate's dispatch: who starts next, and when to look again.

import (
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// dispatchLocked grants every waiter that can start now, in the queue's
// order, and arms a timer for the earliest start still to come.
func (g *Gate) dispatchLocked(now int64, wk *core.Wakes) {
	if g.isClosed {
		return // its waiters fail with ErrGateClosed
	}
	var wakeAt int64
	for g.provider.Waiters.Len() > 0 {
		if next := nextStart(g.started, g.last, g.interval); next > now {
			wakeAt = next
			break
		}
		if g.ad.pauseUntil > now { // the upstream asked for a pause
			wakeAt = g.ad.pauseUntil
			break
		}
		var key *keyLane
		if len(g.keys) > 0 {
			var fit int64 // when a key whose requests budget is spent takes requests again
			if key = g.pickKeyLocked(now, &Tokens{}, &fit); key == nil {
				wakeAt = g.keyBackAtLocked(now) // or a release will dispatch again
				lower(&wakeAt, fit)
				break
			}
		}
		var tf tokensFit
		w := g.nextLocked(now, &wakeAt, &tf)
		if w == nil {
			break // a release, a start time or a config change will dispatch again
		}
		gr := w.Hold.Owner.(*grant)
		if g.keyBudgets {
			// The key must take the request's cost too; if none can now,
			// the request keeps its place and the pass stops.
			c := gr.cost()
			if key = g.pickKeyLocked(now, &c, &wakeAt); key == nil {
				lower(&wakeAt, g.keyBackAtLocked(now))
				break // or a release will dispatch again
			}
		}
		ml := gr.model
		g.provider.Serve(w)
		tf.served(w) // the blockers it passed, on the token caps
		gr.unqueue()
		w.Hold.At = now
		g.seq++
		w.Hold.ID = g.seq
		g.provider.Holders.Add(w.Hold, &gr.idx[0])
		gr.n = g.provider.Holders.Len()
		// A learner's limit may change with each start (the test of a cut
		// lets no other start go): the rest of this pass runs under it.
		g.ad.l.started(gr.n, now)
		ml.lane.Holders.Add(w.Hold, &gr.idx[1])
		gr.mN = ml.lane.Holders.Len()
		g.tok.held += int(gr.units)
		ml.tok.held += int(gr.units)
		ml.l.started(gr.mN, now)
		gr.bud, gr.step = g.budgetsOf(ml), int32(now/int64(budgetStep))
		if key != nil {
			gr.key = key
			gr.bud[2] = key.bud
			key.lane.Holders.Add(w.Hold, &gr.idx[2])
			gr.keyN = key.lane.Holders.Len()
			key.l.started(gr.keyN, now)
		}
		for _, b := range gr.bud {
			b.charge(gr.cost(), now)
		}
		gr.prev = starts{g.started, g.last}
		gr.modelPrev = starts{ml.started, ml.last}
		g.started, g.last = true, now
		ml.started, ml.last, ml.lastID = true, now, w.Hold.ID
		wk.Grant(w)
	}
	g.learnedLocked(now) // a probe that started arms its timer
	g.armLocked(wakeAt, now)
}

// nextLocked returns the waiter to start now, or nil: in the queue's order
// (class, flow turns, arrival), the first whose class may take a provider
// slot and whose model has room and is due. It lowers *wakeAt to the
// earliest start of a model that is not due yet. tf keeps the blockers
// the choice passed, to count once the waiter is served.
func (g *Gate) nextLocked(now int64, wakeAt *int64, tf *tokensFit) *core.Waiter {
	w, _ := g.provider.Candidate(func(w *core.Waiter, _ bool) bool {
		ml := w.Hold.Owner.(*grant).model
		if tf.stopped || tf.scanned() || !ml.lane.HasRoom() {
			return false
		}
		if next := nextStart(ml.started, ml.last, ml.interval); next > now {
			lower(wakeAt, next)
			return false
		}
		return tf.ok(g, w, now, wakeAt)
	})
	return w
}

// armLocked makes a dispatch run at the clock time at (0: none needed).
func (g *Gate) armLocked(at, now int64) {
	if g.timer != nil && (at == 0 || at != g.timerAt) {
		g.timer.Stop()
		g.timer = nil
	}
	if at == 0 || g.timer != nil {
		return
	}
	g.timerAt = at
	g.timerGen++
	gen := g.timerGen
	g.timer = g.clk.AfterFunc(time.Duration(at-now), func() {
		var wk core.Wakes
		g.mu.Lock()
		if g.timerGen == gen { // not replaced meanwhile
			g.timer = nil
		}
		g.dispatchLocked(g.eng.Clock.Nanos(), &wk)
		g.mu.Unlock()
		wk.Wake()
	})
}
