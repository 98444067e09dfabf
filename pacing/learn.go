package pacing

import (
	"log/slog"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/learn"
	"github.com/inflight-go/inflight/pacing/upstream"
)

// AdaptiveConfig turns on the learned cap: the provider's concurrency cap
// is learned from what the upstream answers (see Gate.Report) instead of
// configured; a configured max_concurrent_requests stays a ceiling. Its
// fields, all optional, are min, max, initial and retest_ms (see
// upstream.AdaptiveConfig).
type AdaptiveConfig = upstream.AdaptiveConfig

// Defaults of AdaptiveConfig.
const (
	DefaultAdaptiveMin     = upstream.DefaultAdaptiveMin
	DefaultAdaptiveMax     = upstream.DefaultAdaptiveMax
	DefaultAdaptiveInitial = upstream.DefaultAdaptiveInitial
	DefaultRetest          = upstream.DefaultRetest
	// QuotaPause is how long a key out of quota leaves the pool when the
	// upstream does not say.
	QuotaPause = time.Minute
	// maxPause bounds the pause of new starts that a Retry-After asks for.
	maxPause = 10 * time.Second
)

// Learned is the state of a Gate's learned cap (see upstream.Learned).
type Learned = upstream.Learned

// adaptive is a Gate's learning and its pauses; under the Gate's lock.
type adaptive struct {
	l          *learner // the provider's cap; nil: not learning, or a key pool learns
	pauseUntil int64    // no start before it (a Retry-After), clock nanos
	byKind     [len(Learned{}.ByKind)]uint64
	onChange   func(LimitChange)
	seq        uint64        // the number of the last change made
	pending    []LimitChange // made under the lock, delivered after it, oldest first
	delivering bool          // a caller is delivering pending to onChange
}

// adaptLocked starts, reconfigures or stops learning under g.cfg: the
// provider's cap, or with a key pool each key's (a key is usually an
// account of its own, with a cap of its own).
func (g *Gate) adaptLocked() {
	a := g.cfg.Adaptive
	if a == nil || len(g.keys) > 0 {
		g.ad.stop()
		g.ad.l = nil
	}
	for name, ml := range g.models {
		m := g.cfg.Models[name].Adaptive
		switch {
		case m == nil:
			ml.l.stop()
			ml.l = nil
		case ml.l == nil:
			ml.l = newLearner(m, ml.capCfg, g.seq)
			ml.l.lane, ml.l.model = &ml.lane, name
		default:
			ml.l.configure(m, ml.capCfg)
		}
	}
	for _, kl := range g.keys {
		switch {
		case a == nil:
			kl.stopLearning()
		case kl.l == nil:
			kl.l = newLearner(a, kl.configured, g.seq)
			kl.l.lane, kl.l.key = &kl.lane, kl.id
		default:
			kl.l.configure(a, kl.configured)
		}
	}
	if a != nil && len(g.keys) == 0 {
		if g.ad.l == nil {
			g.ad.l = newLearner(a, g.cfg.MaxConcurrentRequests, g.seq)
		} else {
			g.ad.l.configure(a, g.cfg.MaxConcurrentRequests)
		}
		g.ad.l.lane = &g.provider
	}
	g.learnedLocked(g.eng.Clock.Nanos())
}

// learnedLocked applies each learner's limit to its lane, logs and queues
// the changes of a cap (from ev if it was by, else from time), and arms the
// learners' timers.
func (g *Gate) learnedLocked(now int64) {
	if g.ad.l != nil {
		g.syncLocked(g.ad.l, now)
	}
	for _, kl := range g.keys {
		if kl.l != nil {
			g.syncLocked(kl.l, now)
		}
	}
	for _, ml := range g.models {
		if ml.l != nil {
			g.syncLocked(ml.l, now)
		}
	}
}

func (g *Gate) syncLocked(l *learner, now int64) {
	l.lane.Limit = l.Limit(now)
	if l.Lo != l.told.Cap || l.Hi != l.told.Ceiling {
		ev := l.ev
		g.ad.seq++
		c := LimitChange{Seq: g.ad.seq, Provider: g.name, Model: l.model, Key: l.key, OldCap: l.told.Cap, Cap: l.Lo, OldCeiling: l.told.Ceiling, Ceiling: l.Hi, Evidence: ev}
		l.told.Cap, l.told.Ceiling = l.Lo, l.Hi
		l.changes++
		g.logChangeLocked(c)
		if g.ad.onChange != nil {
			if len(g.ad.pending) >= MaxPendingChanges {
				g.ad.pending = g.ad.pending[1:] // the oldest goes; Seq shows the gap
			}
			g.ad.pending = append(g.ad.pending, c)
		}
	}
	l.ev = Evidence{}
	at := l.WakeAt(now)
	if l.timer != nil && at != l.timerAt {
		l.timer.Stop()
		l.timer = nil
	}
	if at == 0 || l.timer != nil || g.isClosed { // closed: Close stopped them for good
		return
	}
	l.timerAt = at
	l.timerGen++
	gen := l.timerGen
	l.timer = g.clk.AfterFunc(time.Duration(max(at-now, 0)), func() {
		g.mu.Lock()
		if g.isClosed || !g.learningLocked(l) || l.timerGen != gen {
			g.mu.Unlock()
			return
		}
		l.timer = nil
		now := g.eng.Clock.Nanos()
		l.Tick(now, g.seq)
		g.learnedLocked(now)
		// The hook runs on this goroutine, where a panic would end the
		// process: it is logged instead.
		defer func() {
			if v := recover(); v != nil {
				g.eng.Policy.Log().Error("pacing: OnLimitChange hook panicked", slog.String("provider", g.name), slog.Any("panic", v))
			}
		}()
		g.redispatchLocked(now, &core.Wakes{})
	})
}

// logChangeLocked logs the change c, under the Gate's lock: a logger
// that panics there would leave the lock held (and every later call, the
// releases of the slots held among them, hung), so its panic goes no
// further.
func (g *Gate) logChangeLocked(c LimitChange) {
	defer func() { _ = recover() }()
	g.eng.Policy.Log().Debug("pacing: learned cap", slog.Uint64("seq", c.Seq), slog.String("provider", g.name), slog.String("model", c.Model), slog.String("key", c.Key),
		slog.Int("old", c.OldCap), slog.Int("new", c.Cap), slog.Int("old_ceiling", c.OldCeiling), slog.Int("ceiling", c.Ceiling),
		slog.String("evidence", c.Evidence.Kind.String()), slog.Int("in_flight_at_start", c.Evidence.InFlight))
}

// learningLocked reports whether l is still one of the Gate's learners.
func (g *Gate) learningLocked(l *learner) bool {
	switch {
	case l.model != "":
		ml := g.models[l.model]
		return ml != nil && ml.l == l
	case l.key != "":
		kl := g.keyByID[l.key]
		return kl != nil && kl.l == l
	}
	return g.ad.l == l
}

// stopTimersLocked stops the learners' timers, for Close.
func (g *Gate) stopTimersLocked() {
	g.ad.stop()
	for _, kl := range g.keys {
		kl.l.stop()
	}
	for _, ml := range g.models {
		ml.l.stop()
	}
}

func (a *adaptive) stop() { a.l.stop() }

func (kl *keyLane) stopLearning() {
	kl.l.stop()
	kl.l = nil
	kl.lane.Limit = limitOf(kl.configured)
}

// keyBackAtLocked returns when the first key out of quota after now comes
// back, or 0 when none is out.
func (g *Gate) keyBackAtLocked(now int64) int64 {
	var at int64
	for _, k := range g.keys {
		if k.outUntil > now && (at == 0 || k.outUntil < at) {
			at = k.outUntil
		}
	}
	return at
}

// Report tells the Gate how the upstream answered the request of gr: call
// it once per grant, as soon as the answer is known, and before the grant's
// Slot is released, with the verdict of Classify (or of ClassifyAsRead,
// which gives it as the answer's body passes, before the body's end can
// release the slot). With learning on, Admitted and Concurrency move the
// learned caps on the request's path (its model's, with
// ModelConfig.Adaptive; its key's, when a key pool learns; the provider's,
// with Config.Adaptive): an admission proves each of them, a refusal counts
// against the most specific one. A Rate or Overload verdict pauses new
// starts for its RetryAfter (at most 10 s; 1 s when it gives none): with a
// key pool the key's starts, else all of the provider's; Overload also
// lowers a learned cap a little. A Quota verdict takes the grant's API key
// out of the pool for its RetryAfter (QuotaPause when it gives none). Other
// (a failed exchange: report it too) proves nothing: a probe it was is
// withdrawn. A grant never reported is taken as admitted a moment after its
// start, as a probe that no refusal followed. A bypassed grant reports
// nothing. A refusal (any verdict but Admitted and Other) returns what the
// request charged the token budgets (Settle). A 429 whose body was cut
// before it told the refusal's kind is Other (ClassifyAsRead): reported
// here it leaves the request's charge standing, which a Transport, that
// sees the status, returns.
//
// Only the first call for a grant counts: a later one, with whatever
// verdict, changes nothing and is not counted in Learned.ByKind.
func (g *Gate) Report(gr Grant, v Verdict) {
	if gr.gate != g || gr.Slot == nil || gr.Slot.Bypassed() || gr.InFlight == 0 {
		return // another Gate's grant, or no grant: no evidence here
	}
	// The record behind the grant's Slot; one Grant copied, or its Slot,
	// share it.
	own, _ := (*core.Handle)(gr.Slot).Hold().Owner.(*grant)
	g.mu.Lock()
	if g.isClosed { // nothing more to learn, and no timer to arm
		g.mu.Unlock()
		return
	}
	if own != nil {
		if own.reported {
			g.mu.Unlock()
			return
		}
		own.reported = true
	}
	now := g.eng.Clock.Nanos()
	if int(v.Kind) < len(g.ad.byKind) {
		g.ad.byKind[v.Kind]++
	}
	// The learning lanes on the request's path, the most specific first:
	// its model's, its key's, the provider's. An admission proves each of
	// their caps; a refusal is laid to the most specific one, and tells the
	// others nothing.
	var path [3]struct {
		l *learner
		n int
	}
	np := 0
	if ml := g.models[gr.model]; ml != nil && ml.l != nil {
		path[np].l, path[np].n = ml.l, gr.modelN
		np++
	}
	if kl := g.keyByID[gr.Key]; kl != nil && kl.l != nil {
		path[np].l, path[np].n = kl.l, gr.keyN
		np++
	}
	if g.ad.l != nil {
		path[np].l, path[np].n = g.ad.l, gr.InFlight
		np++
	}
	for i, p := range path[:np] {
		step := learn.Route(learn.Kind(v.Kind), i == 0)
		p.l.Take(learn.Answer{Step: step, N: p.n, ID: gr.id, Seq: g.seq, At: gr.at, Now: now})
		if step == learn.Withdrawn {
			continue
		}
		p.l.ev = Evidence{Kind: v.Kind, InFlight: p.n}
	}
	// What the caps are not told: a rate limit or an overload pauses new
	// starts, a quota takes the key out of the pool.
	switch v.Kind {
	case Rate, Overload:
		d := v.RetryAfter
		if d <= 0 {
			d = time.Second
		}
		until := now + int64(min(d, maxPause))
		if gr.Key == "" {
			g.ad.pauseUntil = max(g.ad.pauseUntil, until)
		} else if kl := g.keyByID[gr.Key]; kl != nil {
			kl.outUntil = max(kl.outUntil, until) // the key's allowance, not the others'
		} // a key no longer in the pool gets no more starts to pause
	case Quota:
		if kl := g.keyByID[gr.Key]; kl != nil {
			d := v.RetryAfter
			if d <= 0 {
				d = QuotaPause
			}
			kl.outUntil = max(kl.outUntil, now+int64(min(d, maxRetryAfter)))
		}
	}
	g.learnedLocked(now)
	// A request the upstream refused was not served: it charges its
	// budgets nothing. The dispatch after it runs under the caps just
	// learned.
	if own != nil && v.Kind != Admitted && v.Kind != Other {
		g.settleLocked(own, Tokens{}, endedUnserved)
	}
	g.redispatchLocked(now, &core.Wakes{})
}

// unsent takes gr's request as never sent (its base's error wrapped
// slots.ErrNotSent, or was a dial error), as a grant given back: see
// unsentLocked. It is no answer either: a later Report counts nothing.
func (g *Gate) unsent(gr Grant) {
	own := g.own(gr)
	if own == nil {
		return
	}
	var wk core.Wakes
	g.mu.Lock()
	own.reported = true
	g.unsentLocked(own, gr.id, gr.at)
	g.dispatchLocked(g.eng.Clock.Nanos(), &wk)
	g.mu.Unlock()
	wk.Wake()
}

// nextStart is when a start spaced interval after the last one (at last,
// if one started) is allowed, clock nanos: the interval in force now, so
// that Reconfigure changes the spacing at once.
func nextStart(started bool, last int64, interval time.Duration) int64 {
	if !started {
		return 0
	}
	return last + int64(interval)
}

// unsentLocked takes back what the start numbered id, at, of gr did: it
// charges nothing, its interval is undone if no start came since, and a
// probe it was is withdrawn.
func (g *Gate) unsentLocked(gr *grant, id uint64, at int64) {
	g.settleLocked(gr, Tokens{}, endedUnserved)
	if g.seq == id {
		g.started, g.last = gr.prev.started, gr.prev.last
	}
	if ml := gr.model; ml.lastID == id {
		ml.started, ml.last = gr.modelPrev.started, gr.modelPrev.last
	}
	if g.ad.l != nil {
		g.ad.l.GivenBack(gr.n, at)
	}
	if gr.key != nil && gr.key.l != nil {
		gr.key.l.GivenBack(gr.keyN, at)
	}
	if gr.model.l != nil {
		gr.model.l.GivenBack(gr.mN, at)
	}
}

// Learned returns the state of the learned cap and the answers reported.
func (g *Gate) Learned() Learned {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.eng.Clock.Nanos()
	st := Learned{ByKind: g.ad.byKind}
	if g.ad.pauseUntil > now {
		st.PausedFor = time.Duration(g.ad.pauseUntil - now)
	}
	if l := g.ad.l; l != nil {
		st.Enabled = true
		l.learned(&st)
	}
	for _, kl := range g.keys {
		if l := kl.l; l != nil {
			if st.Keys == nil {
				st.Keys = make(map[string]Learned, len(g.keys))
			}
			st.Enabled = true
			k := Learned{Enabled: true}
			l.learned(&k)
			st.Keys[kl.id] = k
		}
	}
	for name, ml := range g.models {
		if l := ml.l; l != nil {
			if st.Models == nil {
				st.Models = map[string]Learned{}
			}
			st.Enabled = true
			m := Learned{Enabled: true}
			l.learned(&m)
			st.Models[name] = m
		}
	}
	return st
}

// learned fills in st's fields of l's cap.
func (l *learner) learned(st *Learned) {
	st.Limit, st.Cap, st.Ceiling, st.Changes = l.lane.Limit, l.Lo, l.Hi, l.changes
	st.Floor, st.Max = l.Floor, l.Ceil
}
