package pacing

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
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
	RetestMS int64 `json:"retest_ms,omitempty"`
}

// Defaults of AdaptiveConfig.
const (
	DefaultAdaptiveMin     = 1
	DefaultAdaptiveMax     = 1024
	DefaultAdaptiveInitial = 4
	DefaultRetest          = 10 * time.Second
	// QuotaPause is how long a key out of quota leaves the pool when the
	// upstream does not say.
	QuotaPause = time.Minute
	// maxPause bounds the pause of new starts that a Retry-After asks for.
	maxPause = 10 * time.Second
)

func (a *AdaptiveConfig) validate(ceiling int) error {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("pacing: adaptive.%s: %v %s", field, v, why)
	}
	switch {
	case a.Min < 0:
		return bad("min", a.Min, "is negative")
	case a.Max < 0:
		return bad("max", a.Max, "is negative")
	case a.Initial < 0:
		return bad("initial", a.Initial, "is negative")
	case a.RetestMS < 0 || a.RetestMS > MaxMS:
		return bad("retest_ms", a.RetestMS, fmt.Sprintf("is outside [0, %d]", MaxMS))
	}
	lo, hi := a.bounds(ceiling)
	if lo > hi {
		return bad("min", lo, fmt.Sprintf("is over the ceiling %d", hi))
	}
	return nil
}

// bounds returns the floor and the ceiling of the learned cap under a
// configured cap (0: none).
func (a *AdaptiveConfig) bounds(configured int) (floor, ceiling int) {
	floor, ceiling = a.Min, a.Max
	if floor == 0 {
		floor = DefaultAdaptiveMin
	}
	if ceiling == 0 {
		ceiling = DefaultAdaptiveMax
		if configured > 0 {
			ceiling = configured
		}
	}
	if configured > 0 {
		ceiling = min(ceiling, configured)
	}
	return floor, ceiling
}

// learner learns one lane's cap from evidence: a start with n in flight that
// the upstream admitted proves the cap is at least n; a concurrency 429 for
// a start with m in flight proves it is below m. It is a state machine under
// its Gate's lock; the Gate applies limit() to the lane after each change.
//
// The cap it keeps, lo, is the count that starts may reach without a test.
// A start over lo is a probe, and happens only when demand fills lo, so an
// app-limited lane never grows. Probes go in batches: up to lo+1 at first,
// then up to lo+2 and lo+4 while no ceiling is known (maxStep), one at a
// time up to a known ceiling and over it. A batch that the upstream admits,
// or that has not been refused within gap (twice the time a refusal takes),
// raises lo to its top; so the climb takes a batch per round trip of a
// refusal and overshoots by less than a batch.
//
// A refusal of a probe sets the ceiling hi to the count below it; the next
// probe above hi waits retest, so holding a steady cap costs one 429 per
// retest. A refusal at a count that had been proven since the last cut
// means the cap fell: lo halves at once (a drop is usually large, and each
// start over the new cap is a 429 until enough holders finish), and
// further refusals before any admission step down by 1, 1, 2, 4, ...
// After a cut, starts go one at a time until one is admitted: a refusal
// takes a round trip to arrive, and starts in that time would meet the same
// fallen cap.
type learner struct {
	floor, ceil int
	retest      time.Duration

	lo     int    // starts up to lo go without a test
	hi     int    // the cap is at most hi, as of hiAt (ceil: unknown)
	hiAt   int64  // clock nanos
	proven int    // the highest start admitted since the last cut
	cutSeq uint64 // starts numbered up to it came before the last cut: stale evidence
	streak int    // refusals since the last admission after a cut

	probeN   int   // the highest start of the batch out; 0: none
	probeAt  int64 // when its last start went
	probeTop int   // the limit while the batch is out
	step     int   // the next batch's width
	gap      time.Duration
	refusal  time.Duration // moving average of how long a refusal takes; 0: none seen

	timer    *clock.Timer
	timerAt  int64
	timerGen uint64

	changes uint64
	told    LimitChange // the cap and ceiling last reported
}

// Evidence is one answer as the learner saw it, for Learned and the logs.
type Evidence struct {
	Kind     Kind
	InFlight int // in flight at the request's start, itself included
}

// Learned is the state of a Gate's learned cap.
type Learned struct {
	Enabled bool
	Limit   int // the limit admissions run under now (0 while the test of a cut is out)
	Cap     int // the learned cap: starts up to it go without a test
	Ceiling int // the cap is at most this, as last seen (the configured ceiling when unknown)
	Changes uint64
	// ByKind counts the answers reported, by Kind.
	ByKind    [len(kindNames)]uint64
	PausedFor time.Duration // new starts wait this long for a Retry-After
}

func newLearner(a *AdaptiveConfig, configured int) *learner {
	l := &learner{gap: 500 * time.Millisecond, step: 1}
	l.configure(a, configured)
	init := a.Initial
	if init == 0 {
		init = DefaultAdaptiveInitial
	}
	l.lo = min(max(init, l.floor), l.ceil)
	l.hi = l.ceil
	return l
}

func (l *learner) configure(a *AdaptiveConfig, configured int) {
	l.floor, l.ceil = a.bounds(configured)
	l.retest = time.Duration(a.RetestMS) * time.Millisecond
	if l.retest == 0 {
		l.retest = DefaultRetest
	}
	l.lo = min(max(l.lo, l.floor), l.ceil)
	l.hi = min(max(l.hi, l.lo), l.ceil)
}

// maxStep bounds the width of a batch of probes, and so the 429s of an
// overshoot when the climb meets the ceiling.
const maxStep = 4

// width is the width of the next batch of probes.
func (l *learner) width() int {
	w := max(l.step, 1)
	if l.lo < l.hi && l.hi < l.ceil {
		w = min(w, l.hi-l.lo) // up to the known ceiling
	} else if l.hi < l.ceil {
		w = 1 // a retest
	}
	return min(w, l.ceil-l.lo)
}

// mayProbe reports whether a batch of probes may start now.
func (l *learner) mayProbe(now int64) bool {
	if l.probeN != 0 || l.streak > 0 || l.lo >= l.ceil {
		return false
	}
	return l.lo < l.hi || now >= l.hiAt+int64(l.retest)
}

// limit is the lane's limit now: lo, and the batch's top while a batch of
// probes may go or is out (0 while the test of a cut is out).
func (l *learner) limit(now int64) int {
	switch {
	case l.probeN != 0:
		return l.probeTop
	case l.mayProbe(now):
		return l.lo + l.width()
	}
	return l.lo
}

// wakeAt is when the limit next changes by itself (0: only on evidence).
func (l *learner) wakeAt(now int64) int64 {
	switch {
	case l.probeN != 0:
		return l.probeAt + int64(l.gap)
	case l.lo >= l.hi && l.lo < l.ceil && now < l.hiAt+int64(l.retest):
		return l.hiAt + int64(l.retest)
	}
	return 0
}

// started notes a start with n in flight.
func (l *learner) started(n int, now int64) {
	switch {
	case l.streak > 0 && l.probeN == 0:
		// Since the last cut nothing has been admitted: this start tests
		// the cut, and no other starts until it is answered (probeTop 0).
		l.probeN, l.probeAt, l.probeTop = n, now, 0
		return
	case n <= l.lo || l.streak > 0:
		return
	case l.probeN == 0:
		l.probeTop = l.lo + l.width()
	}
	l.probeN, l.probeAt = max(l.probeN, n), now
}

// givenBack notes that the start with n in flight at was given back unsent.
func (l *learner) givenBack(n int, at int64) {
	if l.probeN == n && l.probeAt == at {
		l.probeN = 0
	}
}

// tick presumes an unanswered probe admitted once gap has passed.
func (l *learner) tick(now int64) {
	if l.probeN != 0 && now >= l.probeAt+int64(l.gap) {
		l.batchDone(l.probeN)
	}
}

// raise takes n as a count the upstream admits now.
func (l *learner) raise(n int) {
	if n > l.lo {
		l.lo = min(n, l.ceil)
	}
	if l.lo > l.hi { // the ceiling rose: it is unknown again
		l.hi = l.ceil
	}
}

// admitted notes that start number id, with n in flight, was admitted.
func (l *learner) admitted(n int, id uint64) {
	if id <= l.cutSeq {
		return // started before the last cut: proves what the cut undid
	}
	if l.probeN != 0 && n >= l.probeN {
		l.batchDone(n)
		return
	}
	l.streak = 0
	l.proven = max(l.proven, n)
	l.raise(n)
}

// batchDone takes the batch of probes up to n as admitted; the next one may
// be wider.
func (l *learner) batchDone(n int) {
	if n > l.lo {
		l.step = min(2*max(l.step, 1), maxStep)
	}
	l.probeN, l.streak = 0, 0
	l.proven = max(l.proven, n)
	l.raise(n)
}

// refused notes a concurrency refusal of start number id, made at with m
// in flight; seq numbers the last start so far.
func (l *learner) refused(m int, id uint64, at, now int64, seq uint64) {
	if d := time.Duration(now - at); d >= 0 {
		if l.refusal == 0 {
			l.refusal = d
		} else {
			l.refusal = (3*l.refusal + d) / 4
		}
		l.gap = min(max(2*l.refusal, 20*time.Millisecond), 2*time.Second)
	}
	if id <= l.cutSeq {
		return // counted by the cut that followed its start
	}
	if m > l.lo || l.probeN != 0 && m > 2*l.lo-l.probeN {
		// A probe refused: the cap kept stands, and is the ceiling now.
		// While a batch of probes is out, a start within its width below
		// lo counts as one of them: it may have reached the upstream
		// after a probe and lost its place to it.
		l.lo = min(max(m-1, l.lo, l.floor), l.ceil)
		l.hi = l.lo
		l.hiAt, l.cutSeq = now, seq
		l.proven = min(l.proven, l.lo)
		l.probeN, l.step = 0, 1
		return
	}
	l.streak++
	switch {
	case l.streak == 1 && m <= l.proven:
		// A count admitted since the last cut is refused now: the cap
		// fell, by how much is unknown.
		l.lo = m / 2
	case l.streak <= 2:
		l.lo = m - 1
	default:
		l.lo = m - 1<<(l.streak-2)
	}
	l.lo = min(max(l.lo, l.floor), l.ceil)
	l.hi = max(min(m-1, l.ceil), l.lo)
	l.hiAt, l.cutSeq = now, seq
	l.proven = 0
	l.probeN, l.step = 0, 1
}

// overloaded lowers lo by a tenth (at least one), leaving the ceiling.
func (l *learner) overloaded() {
	l.lo = max(l.lo-max(1, l.lo/10), l.floor)
	l.probeN, l.step = 0, 1
}

// adaptive is a Gate's learning and its pauses; under the Gate's lock.
type adaptive struct {
	l          *learner // nil: not learning
	pauseUntil int64    // no start before it (a Retry-After), clock nanos
	byKind     [len(kindNames)]uint64
	onChange   func(LimitChange)
	pending    []LimitChange // made under the lock, reported after it
}

// adaptLocked starts, reconfigures or stops learning under g.cfg.
func (g *Gate) adaptLocked() {
	a := g.cfg.Adaptive
	switch {
	case a == nil:
		g.ad.stop()
		g.ad.l = nil
		return
	case g.ad.l == nil:
		g.ad.l = newLearner(a, g.cfg.MaxConcurrentRequests)
	default:
		g.ad.l.configure(a, g.cfg.MaxConcurrentRequests)
	}
	g.learnedLocked(g.eng.Clock.Nanos(), Evidence{})
}

// learnedLocked applies the learner's limit to the provider lane, logs a
// change with the evidence behind it, and arms the learner's timer.
func (g *Gate) learnedLocked(now int64, ev Evidence) {
	l := g.ad.l
	if l == nil {
		return
	}
	g.provider.Limit = l.limit(now)
	if l.lo != l.told.Cap || l.hi != l.told.Ceiling {
		c := LimitChange{Provider: g.name, OldCap: l.told.Cap, Cap: l.lo, OldCeiling: l.told.Ceiling, Ceiling: l.hi, Evidence: ev}
		l.told.Cap, l.told.Ceiling = l.lo, l.hi
		l.changes++
		g.eng.Policy.Log().Debug("pacing: learned cap", slog.String("provider", g.name),
			slog.Int("old", c.OldCap), slog.Int("new", c.Cap), slog.Int("old_ceiling", c.OldCeiling), slog.Int("ceiling", c.Ceiling),
			slog.String("evidence", ev.Kind.String()), slog.Int("in_flight_at_start", ev.InFlight))
		if g.ad.onChange != nil {
			g.ad.pending = append(g.ad.pending, c)
		}
	}
	at := l.wakeAt(now)
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
		if g.ad.l != l || l.timerGen != gen {
			g.mu.Unlock()
			return
		}
		l.timer = nil
		now := g.eng.Clock.Nanos()
		l.tick(now)
		g.learnedLocked(now, Evidence{})
		g.redispatchLocked(now)
	})
}

// redispatchLocked dispatches after a change of limits, unlocks, and reports
// the changes.
func (g *Gate) redispatchLocked(now int64) {
	var wk core.Wakes
	g.dispatchLocked(now, &wk)
	notify := g.ad.takeLocked()
	g.mu.Unlock()
	wk.Wake()
	notify()
}

// takeLocked returns a function that reports the changes made so far to
// the hook, to be called once the Gate is unlocked.
func (a *adaptive) takeLocked() func() {
	if len(a.pending) == 0 {
		return func() {}
	}
	f, cs := a.onChange, a.pending
	a.pending = nil
	return func() {
		for _, c := range cs {
			f(c)
		}
	}
}

// LimitChange is a change of a Gate's learned cap or of its ceiling, with
// the evidence behind it. An Evidence of Kind Other and InFlight 0 is the
// passing of time (probes taken as admitted, a retest due) or a
// Reconfigure.
type LimitChange struct {
	Provider            string
	OldCap, Cap         int
	OldCeiling, Ceiling int
	Evidence            Evidence
}

// OnLimitChange sets f to be called with each change of the learned cap or
// ceiling (nil: none), for events and metrics. f is called after the Gate's
// lock is released, possibly from several goroutines at once, and should
// return quickly: it delays the request whose answer made the change.
func (g *Gate) OnLimitChange(f func(LimitChange)) {
	g.mu.Lock()
	g.ad.onChange = f
	if f == nil {
		g.ad.pending = nil
	}
	g.mu.Unlock()
}

// stop stops the learner's timer.
func (a *adaptive) stop() {
	if a.l != nil && a.l.timer != nil {
		a.l.timer.Stop()
		a.l.timer = nil
	}
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
// it once per grant, as soon as the answer's status is known (before its
// body is read), and before the grant's Slot is released, with the verdict
// of Classify. With learning on (Config.Adaptive), Admitted and Concurrency
// move the learned cap. A Rate or Overload verdict pauses new starts for its
// RetryAfter (at most 10 s; 1 s when it gives none); Overload also lowers a
// learned cap a little. A Quota verdict takes the grant's API key out of the
// pool for its RetryAfter (QuotaPause when it gives none). A bypassed grant
// reports nothing.
func (g *Gate) Report(gr Grant, v Verdict) {
	if gr.Slot == nil || gr.Slot.Bypassed() || gr.InFlight == 0 {
		return
	}
	g.mu.Lock()
	now := g.eng.Clock.Nanos()
	if int(v.Kind) < len(g.ad.byKind) {
		g.ad.byKind[v.Kind]++
	}
	l := g.ad.l
	switch v.Kind {
	case Admitted:
		if l != nil {
			l.admitted(gr.InFlight, gr.id)
		}
	case Concurrency:
		if l != nil {
			l.refused(gr.InFlight, gr.id, gr.at, now, g.seq)
		}
	case Rate, Overload:
		d := v.RetryAfter
		if d <= 0 {
			d = time.Second
		}
		g.ad.pauseUntil = max(g.ad.pauseUntil, now+int64(min(d, maxPause)))
		if v.Kind == Overload && l != nil {
			l.overloaded()
		}
	case Quota:
		if kl := g.keyByID[gr.Key]; kl != nil {
			d := v.RetryAfter
			if d <= 0 {
				d = QuotaPause
			}
			kl.outUntil = max(kl.outUntil, now+int64(d))
		}
	}
	g.learnedLocked(now, Evidence{Kind: v.Kind, InFlight: gr.InFlight})
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
		st.Limit = g.provider.Limit
		st.Cap, st.Ceiling, st.Changes = l.lo, l.hi, l.changes
	}
	return st
}
