package pacing

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/learn"
)

// AdaptiveConfig turns on the learned cap: the provider's concurrency cap is
// learned from what the upstream answers (see Gate.Report) instead of
// configured. Every field is optional; the section's presence turns
// learning on. A configured max_concurrent_requests stays a ceiling.
type AdaptiveConfig struct {
	// Min is the floor of the learned cap; DefaultAdaptiveMin when left out.
	Min int `json:"min,omitempty"`
	// Max is its ceiling: the smaller of this and max_concurrent_requests
	// when both are set; DefaultAdaptiveMax when neither is.
	Max int `json:"max,omitempty"`
	// Initial is where learning starts; DefaultAdaptiveInitial (within
	// [Min, Max]) when left out.
	Initial int `json:"initial,omitempty"`
	// RetestMS is how long a ceiling found by a 429 holds before one
	// request tests whether it has risen, in milliseconds;
	// DefaultRetest when left out. Each test that finds the ceiling
	// unchanged costs one 429: shorter finds a rise sooner and costs more.
	// While demand stays over the cap, that is a 429 every RetestMS per
	// learned cap (six a minute at the default), whatever the traffic.
	RetestMS int64 `json:"retest_ms,omitempty"`
}

// Defaults of AdaptiveConfig.
const (
	DefaultAdaptiveMin     = learn.DefaultMin
	DefaultAdaptiveMax     = learn.DefaultMax
	DefaultAdaptiveInitial = learn.DefaultInitial
	DefaultRetest          = learn.DefaultRetest
	// QuotaPause is how long a key out of quota leaves the pool when the
	// upstream does not say.
	QuotaPause = time.Minute
	// maxPause bounds the pause of new starts that a Retry-After asks for.
	maxPause = 10 * time.Second
)

func (a *AdaptiveConfig) validate(path string, ceiling int) error {
	path += "."
	switch {
	case a.Min < 0:
		return bad(path+"min", a.Min, "is negative")
	case a.Max < 0:
		return bad(path+"max", a.Max, "is negative")
	case a.Initial < 0:
		return bad(path+"initial", a.Initial, "is negative")
	case a.RetestMS < 0 || a.RetestMS > MaxMS:
		return bad(path+"retest_ms", a.RetestMS, fmt.Sprintf("is outside [0, %d]", MaxMS))
	}
	lo, hi := a.bounds(ceiling)
	if lo > hi {
		return bad(path+"min", lo, fmt.Sprintf("is over the ceiling %d", hi))
	}
	return nil
}

// bounds returns the floor and the ceiling of the learned cap under a
// configured cap (0: none).
func (a *AdaptiveConfig) bounds(configured int) (floor, ceiling int) {
	return a.settings().Bounds(configured)
}

// settings returns a as the learner takes it.
func (a *AdaptiveConfig) settings() learn.Settings {
	return learn.Settings{Min: a.Min, Max: a.Max, Initial: a.Initial, Retest: time.Duration(a.RetestMS) * time.Millisecond}
}

// Validate reports whether a is a valid learning setup under a configured
// cap (0: none), as Config.Validate reports it for a provider.
func (a AdaptiveConfig) Validate(configured int) error { return a.validate("adaptive", configured) }

// Learned is the state of a Gate's learned cap.
type Learned struct {
	Enabled bool
	Limit   int // the limit admissions run under now (the floor while the test of a cut is out)
	Cap     int // the learned cap: starts up to it go without a test
	Ceiling int // the cap is at most this, as last seen (Max when unknown)
	// Floor and Max are the bounds the cap moves within: AdaptiveConfig's
	// Min and Max with their defaults, Max no higher than a configured
	// max_concurrent_requests. Both are 0 when this cap is not learned.
	Floor, Max int
	Changes    uint64 // changes of Cap or Ceiling, the setting of the first included
	// ByKind counts the grants reported, by the Kind of their verdict.
	ByKind    [len(kindNames)]uint64
	PausedFor time.Duration // new starts wait this long for a Retry-After
	// Keys is each API key's learned cap when a key pool learns (the
	// fields above are then the provider's configured ones, and zero).
	Keys map[string]Learned
	// Models is the learned cap of each model with an adaptive section.
	Models map[string]Learned
}

// adaptive is a Gate's learning and its pauses; under the Gate's lock.
type adaptive struct {
	l          *learner // the provider's cap; nil: not learning, or a key pool learns
	pauseUntil int64    // no start before it (a Retry-After), clock nanos
	byKind     [len(kindNames)]uint64
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
			ml.l = newLearner(m, ml.capCfg)
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
			kl.l = newLearner(a, kl.configured)
			kl.l.lane, kl.l.key = &kl.lane, kl.id
		default:
			kl.l.configure(a, kl.configured)
		}
	}
	if a != nil && len(g.keys) == 0 {
		if g.ad.l == nil {
			g.ad.l = newLearner(a, g.cfg.MaxConcurrentRequests)
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
		g.eng.Policy.Log().Debug("pacing: learned cap", slog.Uint64("seq", c.Seq), slog.String("provider", g.name), slog.String("model", l.model), slog.String("key", l.key),
			slog.Int("old", c.OldCap), slog.Int("new", c.Cap), slog.Int("old_ceiling", c.OldCeiling), slog.Int("ceiling", c.Ceiling),
			slog.String("evidence", ev.Kind.String()), slog.Int("in_flight_at_start", ev.InFlight))
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
	if at == 0 || l.timer != nil {
		return
	}
	l.timerAt = at
	l.timerGen++
	gen := l.timerGen
	l.timer = g.clk.AfterFunc(time.Duration(max(at-now, 0)), func() {
		g.mu.Lock()
		if !g.learningLocked(l) || l.timerGen != gen {
			g.mu.Unlock()
			return
		}
		l.timer = nil
		now := g.eng.Clock.Nanos()
		l.Tick(now)
		g.learnedLocked(now)
		// The hook runs on this goroutine, where a panic would end the
		// process: it is logged instead.
		defer func() {
			if v := recover(); v != nil {
				g.eng.Policy.Log().Error("pacing: OnLimitChange hook panicked", slog.String("provider", g.name), slog.Any("panic", v))
			}
		}()
		g.redispatchLocked(now)
	})
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
// it once per grant, as soon as the answer is known, and before the
// grant's Slot is released, with the verdict of Classify (or of
// ClassifyAsRead, which gives it as the answer's body passes, before the
// body's end can release the slot). With learning on, Admitted and Concurrency move the learned
// caps on the request's path (its model's, with ModelConfig.Adaptive; its
// key's, when a key pool learns; the provider's, with Config.Adaptive): an
// admission proves each of them, a refusal counts against the most specific
// one. A Rate or
// Overload verdict pauses new starts for its RetryAfter (at most 10 s; 1 s
// when it gives none): with a key pool the key's starts, else all of the
// provider's; Overload also lowers a learned cap a little. A Quota verdict
// takes the grant's API key out of the pool for its RetryAfter (QuotaPause
// when it gives none). Other (a failed exchange: report it too) proves
// nothing: a probe it was is withdrawn. A grant never reported is taken as
// admitted a moment after its start, as a probe that no refusal followed.
// A bypassed grant reports nothing. A refusal (any verdict but Admitted and
// Other) returns what the request charged the token budgets (Settle).
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
	l, n := path[0].l, path[0].n
	switch v.Kind {
	case Admitted:
		for _, p := range path[:np] {
			p.l.Admitted(p.n, gr.id)
			p.l.ev = Evidence{Kind: v.Kind, InFlight: p.n}
		}
	case Concurrency:
		if l != nil {
			l.Refused(n, gr.id, gr.at, now, g.seq)
			l.ev = Evidence{Kind: v.Kind, InFlight: n}
		}
		for i := 1; i < np; i++ {
			path[i].l.Inconclusive(path[i].n, gr.id)
		}
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
		if v.Kind == Overload && l != nil {
			l.Overloaded(gr.id, g.seq)
			l.ev = Evidence{Kind: v.Kind, InFlight: n}
		}
	case Other:
		// A failed exchange, or an answer about something else: no
		// evidence, and a probe it was is withdrawn, not presumed
		// admitted once its gap has passed.
		for _, p := range path[:np] {
			p.l.Inconclusive(p.n, gr.id)
		}
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
		g.settleLocked(own, Tokens{}, false)
	}
	g.redispatchLocked(now)
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
