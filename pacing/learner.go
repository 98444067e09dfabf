package pacing

import (
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
)

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
// A refusal of a probe sets the ceiling hi to the count below it (or keeps
// lo, for a start that a probe passed on its way); the next probe above hi
// waits retest, so holding a steady cap costs one 429 per retest. A
// refusal at a count within lo means the cap fell, or is noise: over a
// network a client sees an answer end a moment after its upstream let it
// go, so a count seen admitted may be one or two over what the upstream
// had. The first refusal since an admission takes lo one below its count,
// a second two below; a third means the cap fell, and lo halves (a drop is
// usually large, and each start over the new cap is a 429 until enough
// holders finish); further refusals before any admission step down by 2,
// 4, 8, ... After a cut, starts go one at a time until one is admitted: a
// refusal takes a round trip to arrive, and starts in that time would meet
// the same fallen cap.
type learner struct {
	lane        *core.Lane // whose Limit it drives
	model, key  string     // the model or the API key of lane; neither for the provider
	floor, ceil int
	retest      time.Duration

	lo     int    // starts up to lo go without a test
	hi     int    // the cap is at most hi, as of hiAt (ceil: unknown)
	hiAt   int64  // clock nanos
	cutSeq uint64 // starts numbered up to it came before the last cut: stale evidence
	streak int    // refusals since the last admission after a cut

	probeN   int           // the highest start of the batch out; 0: none
	probeAt  int64         // when its last start went
	probeTop int           // the limit while the batch is out
	step     int           // the next batch's width
	gap      time.Duration // how long a probe goes unanswered before it counts as admitted
	refusal  time.Duration // moving average of how long a refusal takes; 0: none seen

	timer    *clock.Timer
	timerAt  int64
	timerGen uint64

	changes uint64
	told    LimitChange // the cap and ceiling last reported
	ev      Evidence    // the answer behind the change not yet reported, if any
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
	// A batch of probes (or the test of a cut) out when the bounds change
	// keeps its evidence, but its top must stay within them: the limit is
	// read from it.
	switch {
	case l.probeN != 0 && l.streak > 0:
		l.probeTop = l.floor // the test of a cut: the floor, raised or lowered
	case l.probeN != 0:
		l.probeTop = min(max(l.probeTop, l.floor), l.ceil)
	}
}

// stop stops the timer; a nil learner has none.
func (l *learner) stop() {
	if l != nil && l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
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
// probes may go or is out (the floor while the test of a cut is out).
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
		// the cut, and no other starts until it is answered, but for the
		// floor, a count known to work (with the default floor of 1, the
		// test itself).
		l.probeN, l.probeAt, l.probeTop = n, now, l.floor
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
	l.raise(n)
}

// batchDone takes the batch of probes up to n as admitted; the next one may
// be wider.
func (l *learner) batchDone(n int) {
	if n > l.lo {
		l.step = min(2*max(l.step, 1), maxStep)
	}
	l.probeN, l.streak = 0, 0
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
		l.probeN, l.step = 0, 1
		return
	}
	l.streak++
	switch {
	case l.streak <= 2:
		// The first refusals since an admission may be noise: over a
		// network the upstream lets a request go a moment before its
		// client sees the end, so a count the client saw admitted may
		// have been one or two more than the upstream had. A step down,
		// then two; the tests of the cut that follow tell a fall from
		// noise.
		l.lo = m - l.streak
	case l.streak == 3:
		// Refused a third time before any admission: the cap fell, by
		// how much is unknown (a drop is usually large).
		l.lo = m / 2
	default:
		l.lo = m - 1<<(l.streak-3)
	}
	l.lo = min(max(l.lo, l.floor), l.ceil)
	l.hi = max(min(m-1, l.ceil), l.lo)
	l.hiAt, l.cutSeq = now, seq
	l.probeN, l.step = 0, 1
}

// inconclusive notes that start number id, with n in flight, was refused
// for another lane's cap or failed: if it was a probe of this one, its
// batch proves nothing and is withdrawn.
func (l *learner) inconclusive(n int, id uint64) {
	if id <= l.cutSeq {
		return // started before the last cut: not one of its probes, nor its test
	}
	if l.probeN != 0 && n > l.lo {
		l.probeN = 0
	}
}

// overloaded lowers lo by a tenth (at least one), leaving the ceiling, once
// per burst: an answer to a start numbered id, made before the last cut
// (seq is the last start's number now), is of a burst already counted.
func (l *learner) overloaded(id, seq uint64) {
	if id <= l.cutSeq {
		return // the burst it belongs to has cut the cap already
	}
	l.lo = max(l.lo-max(1, l.lo/10), l.floor)
	l.probeN, l.step = 0, 1
	l.cutSeq = seq
}
