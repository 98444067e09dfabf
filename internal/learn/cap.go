// Package learn learns a concurrency cap that an upstream keeps hidden,
// from its answers: pacing's Gate learns a provider's, a model's or an API
// key's cap with it, and the fleet's Redis registry learns one cap for all
// of its processes, its state kept in Redis.
package learn

import (
	"slices"
	"time"
)

// Cap learns one concurrency cap from evidence: a start with n in flight that
// the upstream admitted proves the cap is at least n; a concurrency 429 for
// a start with m in flight proves it is below m. It is a state machine, not
// safe for concurrent use; its owner applies Limit to what it caps after
// each change.
//
// The cap it keeps, Lo, is the count that starts may reach without a test.
// A start over Lo is a probe, and happens only when demand fills Lo, so an
// app-limited client never grows. Probes go in batches: up to Lo+1 at first,
// then up to Lo+2 and Lo+4 (maxStep), no higher than a known ceiling Hi;
// one probe over a known ceiling (a retest). A batch that the upstream
// admits, or that has not been refused within Gap of its highest start
// (twice the time a refusal takes while refusal times vary little, more
// while they vary), raises Lo to its top; so the climb takes a batch per
// Gap or less and overshoots by less than a batch. A count over a known
// ceiling (a retest admitted) only makes the ceiling unknown again: Lo
// stays at the old ceiling, and the climb from there begins with one probe
// (at the retest's count), since a count can be over what the upstream had
// (see raise).
//
// A refusal of a probe sets the ceiling Hi: the batch's top less the
// batch's refusals, counted for a Gap while no probe goes, since which of a
// batch's starts the upstream refuses depends on the order they reach it,
// and how many does not. Lo goes to the count below the refused start (or
// stays, for a start that a probe passed on its way), no higher than Hi;
// probes climb from Lo to Hi after the Gap. The next probe above Hi waits
// Retest, so holding a steady cap costs one 429 per retest. A
// refusal at a count within Lo means the cap fell, or is noise: over a
// network a client sees an answer end a moment after its upstream let it
// go, so a count seen admitted may be one or two over what the upstream
// had. The first refusal since an admission takes Lo one below its count,
// a second two below; a third means the cap fell, and Lo halves (a drop is
// usually large, and each start over the new cap is a 429 until enough
// holders finish); further refusals before any admission step down by 2,
// 4, 8, ... After a cut, starts go one at a time until one is admitted: a
// refusal takes a round trip to arrive, and starts in that time would meet
// the same fallen cap.
type Cap struct {
	Floor  int
	Ceil   int
	Retest time.Duration

	Lo     int    // starts up to Lo go without a test
	Hi     int    // the cap is at most Hi, as of HiAt (HiAt 0: none found, Hi is Ceil)
	HiAt   int64  // clock nanos
	CutSeq uint64 // starts numbered up to it came before the last cut or reopened ceiling: stale evidence
	Streak int    // refusals since the last admission after a cut

	ProbeN     int           // the highest start of the batch out; 0: none
	ProbeAt    int64         // when its highest start went
	ProbeTop   int           // the limit while the batch is out
	Step       int           // the next batch's width
	Refusal    time.Duration // moving average of how long a refusal takes; 0: none seen
	RefusalDev time.Duration // moving mean deviation of the refusal time from Refusal

	// The count of a refused batch's refusals (see Refused and countBatch);
	// with no batch counted and no refusal seen (BatchTop and BatchN 0),
	// BatchAfter and BatchEnd hold the starts counted by the last
	// reopening of the ceiling (see raise).
	BatchLo    int                  // Lo when the last batch of probes began
	BatchTop   int                  // the top of the refused batch being counted; 0: none
	BatchAfter uint64               // its starts are numbered above this,
	BatchEnd   uint64               // ... and up to this
	BatchSeen  [batchSeenMax]uint64 // the numbers of its starts refused so far,
	BatchN     int                  // ... the first BatchN of them
	BatchUntil int64                // clock nanos: no probe before, while its refusals come in
}

// New returns a Cap that starts at initial, within [floor, ceil], and
// re-tests a ceiling found after retest.
func New(floor, ceil, initial int, retest time.Duration) *Cap {
	l := &Cap{Step: 1}
	l.Configure(floor, ceil, retest)
	l.Lo = min(max(initial, l.Floor), l.Ceil)
	l.Hi = l.Ceil
	return l
}

// Configure sets the bounds the cap moves within and the re-test interval;
// a floor over the ceiling is taken as the ceiling (the limit is never
// over it).
func (l *Cap) Configure(floor, ceil int, retest time.Duration) {
	// A ceiling no refusal found (no HiAt: Hi is the bound, of this
	// process or, read from a fleet's store, of the one that wrote it)
	// follows the bound, or a raised bound would hold as a ceiling until a
	// retest. One found (HiAt set: a refusal's, a cut's) that a lowered
	// bound met stays where it was found: raised again, the bound must
	// not forget it.
	unknown := l.HiAt == 0
	l.Floor, l.Ceil, l.Retest = min(floor, ceil), ceil, retest
	l.Lo = min(max(l.Lo, l.Floor), l.Ceil)
	if unknown {
		l.Hi = l.Ceil
	}
	l.Hi = min(max(l.Hi, l.Lo), l.Ceil)
	// A batch of probes (or the test of a cut) out when the bounds change
	// keeps its evidence, but its top must stay within them: the limit is
	// read from it.
	switch {
	case l.ProbeN != 0 && l.Streak > 0:
		l.ProbeTop = l.Floor // the test of a cut: the floor, raised or lowered
	case l.ProbeN != 0:
		l.ProbeTop = min(max(l.ProbeTop, l.Floor), l.Ceil)
	}
}

// maxStep bounds the width of a batch of probes, and so the 429s of an
// overshoot when the climb meets the ceiling.
const maxStep = 4

// width is the width of the next batch of probes.
func (l *Cap) width() int {
	w := max(l.Step, 1)
	if l.Lo < l.Hi && l.Hi < l.Ceil {
		w = min(w, l.Hi-l.Lo) // up to the known ceiling
	} else if l.Hi < l.Ceil {
		w = 1 // a retest
	}
	return min(w, l.Ceil-l.Lo)
}

// batchSeenMax bounds the refusals of a batch that are counted: a batch is
// at most maxStep wide, and in a fleet other processes may have started
// over its top before its refusal reached them.
const batchSeenMax = 2 * maxStep

// batchPending reports whether the refusals of a refused batch are still
// coming in at now, so that no probe goes.
func (l *Cap) batchPending(now int64) bool {
	return now < l.BatchUntil && !ahead(l.BatchUntil, now)
}

// ahead reports whether time t is more than maxGap ahead of now: set by
// a clock that has since stepped back, it is ignored (and dropped at the
// next start).
func ahead(t, now int64) bool { return t-now > int64(maxGap) }

// MayProbe reports whether a batch of probes may start now.
func (l *Cap) MayProbe(now int64) bool {
	if l.ProbeN != 0 || l.Streak > 0 || l.Lo >= l.Ceil || l.batchPending(now) {
		return false
	}
	return l.Lo < l.Hi || now >= l.HiAt+int64(l.Retest)
}

// Limit is the limit now: Lo, and the batch's top while a batch of
// probes may go or is out (the floor while the test of a cut is out).
func (l *Cap) Limit(now int64) int {
	switch {
	case l.ProbeN != 0:
		return l.ProbeTop
	case l.MayProbe(now):
		return l.Lo + l.width()
	}
	return l.Lo
}

// WakeAt is when the limit next changes by itself (0: only on evidence).
func (l *Cap) WakeAt(now int64) int64 {
	if l.ProbeN != 0 {
		return l.ProbeAt + int64(l.Gap()) // the batch taken as admitted
	}
	var at int64
	if l.Lo >= l.Hi && l.Lo < l.Ceil {
		at = l.HiAt + int64(l.Retest) // the retest
	}
	if l.batchPending(now) {
		at = max(at, l.BatchUntil) // the probes held while a batch's refusals come in
	}
	if at <= now {
		return 0
	}
	return at
}

// Started notes a start with n in flight.
func (l *Cap) Started(n int, now int64) {
	if ahead(l.BatchUntil, now) {
		l.BatchUntil = 0
	}
	switch {
	case l.Streak > 0 && l.ProbeN == 0:
		// Since the last cut nothing has been admitted: this start tests
		// the cut, and no other starts until it is answered, but for the
		// floor, a count known to work (with the default floor of 1, the
		// test itself).
		l.ProbeN, l.ProbeAt, l.ProbeTop = n, now, l.Floor
		return
	case n <= l.Lo || l.Streak > 0 || l.batchPending(now):
		// While a refused batch's refusals come in, a start over Lo is
		// no probe: another process of a fleet made it under the limit it
		// had before the refusal reached it.
		return
	case l.ProbeN == 0:
		l.ProbeTop = l.Lo + l.width()
		l.BatchLo, l.BatchTop = l.Lo, 0
	}
	// The batch ends a Gap after its highest start: a later start at a
	// count it reached already tests nothing more, and under steady load
	// (a slot freed, another taken) would put off its end for as long as
	// the load lasts. A refusal of such a start that comes after the end
	// is one of a count within the cap, as after an admission. A time
	// ahead (a clock since stepped back) is dropped at the next start at
	// its count: the batch would stay out until the clock came back to it.
	if n > l.ProbeN || ahead(l.ProbeAt, now) {
		l.ProbeN, l.ProbeAt = max(l.ProbeN, n), now
	}
}

// GivenBack notes that the start with n in flight at was given back unsent.
func (l *Cap) GivenBack(n int, at int64) {
	if l.ProbeN == n && l.ProbeAt == at {
		l.ProbeN = 0
	}
}

// Tick presumes an unanswered probe admitted once gap has passed; seq
// numbers the last start so far.
func (l *Cap) Tick(now int64, seq uint64) {
	if l.ProbeN != 0 && now >= l.ProbeAt+int64(l.Gap()) {
		l.batchDone(l.ProbeN, seq)
	}
}

// raise takes n as a count the upstream admits now; seq numbers the last
// start so far.
func (l *Cap) raise(n int, seq uint64) {
	if n > l.Hi && l.Hi < l.Ceil {
		// Over a known ceiling: the cap rose, or the count was over what
		// the upstream had (an end the client has not seen yet; in a
		// fleet, a release still on its way to the store), and one
		// admission cannot tell which. The ceiling is unknown again, but
		// Lo goes no higher than the old ceiling: the climb from there
		// proves the count again, one probe at first, however wide the
		// climb to the ceiling went. So a count one over costs that
		// probe's 429, rather than the refusals of starts under a cap one
		// over the upstream's (which would cut it). The count of a refused
		// batch ends: it would lower the ceiling again.
		//
		// The starts numbered up to seq are stale from here, as after a
		// cut, and a batch still out is withdrawn: the fleet may apply
		// the same evidence again, which must not prove the count twice,
		// and their admissions prove nothing more. Their refusals over Lo
		// still count: the retest's own, when it was taken as admitted
		// before its refusal came, sets the ceiling back (see Refused).
		// (BatchAfter, BatchEnd] holds them, with no refusal seen (a
		// refused batch's always has one).
		l.Lo, l.Hi, l.HiAt = l.Hi, l.Ceil, 0 // none found (see Configure)
		l.ProbeN, l.Step, l.BatchTop, l.BatchN = 0, 1, 0, 0
		l.BatchAfter, l.BatchEnd = l.CutSeq, max(l.CutSeq, seq)
		l.CutSeq = l.BatchEnd
		return
	}
	l.Lo = min(max(l.Lo, n), l.Ceil)
}

// Admitted notes that start number id, with n in flight, was admitted;
// seq numbers the last start so far.
func (l *Cap) Admitted(n int, id, seq uint64) {
	if id <= l.CutSeq {
		return // started before the last cut: proves what the cut undid
	}
	if l.ProbeN != 0 && n >= l.ProbeN {
		l.batchDone(n, seq)
		return
	}
	l.Streak = 0
	l.raise(n, seq)
}

// batchDone takes the batch of probes up to n as admitted; the next one may
// be wider (or one wide, over a ceiling: see raise).
func (l *Cap) batchDone(n int, seq uint64) {
	if n > l.Lo {
		l.Step = min(2*max(l.Step, 1), maxStep)
	}
	l.ProbeN, l.Streak = 0, 0
	l.raise(n, seq)
}

// Refused notes a concurrency refusal of start number id, made at with m
// in flight; seq numbers the last start so far.
func (l *Cap) Refused(m int, id uint64, at, now int64, seq uint64) {
	if d := time.Duration(now - at); d >= 0 {
		l.timeRefusal(d)
	}
	switch {
	case id <= l.CutSeq && !l.reopenedBy(id):
		// Counted by the cut, the ceiling or the reopened ceiling that
		// followed its start, but for the refused batch's.
		l.countBatch(m, id)
		return
	case id <= l.CutSeq && m > l.Lo:
		// A start counted by the reopening of the ceiling, refused over
		// the cap: the retest itself, taken as admitted before its
		// refusal came, or another start at its count. The ceiling is
		// below it again, as for a refused probe. (One refused within
		// the cap goes on as any refusal: the cap fell, or it is noise.)
		l.Hi = min(m-1, l.Ceil)
		l.HiAt, l.CutSeq = found(now), max(l.CutSeq, seq)
		l.ProbeN, l.Step = 0, 1
		return
	}
	if m > l.Lo && l.Streak > 0 {
		// A start over Lo while a cut is tested: another process of a
		// fleet made it under the limit it had before the cut reached it.
		// It lowers the ceiling; the cut goes on. If it was taken for the
		// cut's test (the first start after the cut), it tested nothing,
		// and the next start does: time must not take it for admitted.
		l.Hi = min(l.Hi, max(m-1, l.Lo, l.Floor))
		if l.ProbeN == m && l.ProbeAt == at {
			l.ProbeN = 0
		}
		return
	}
	if m > l.Lo || l.Streak == 0 && l.ProbeN != 0 && m > 2*l.Lo-l.ProbeN {
		// A probe refused: the cap kept stands, and the ceiling is below
		// the batch's top. Which of the batch's starts the upstream
		// refuses depends on the order they reach it, not on their
		// counts, but how many it refuses does not: so the ceiling is the
		// top less the batch's refusals, which the stale branch above
		// counts as they come in, and no probe goes for a Gap. While a
		// batch of probes is out, a start within its width below Lo
		// counts as one of them: it may have reached the upstream after a
		// probe and lost its place to it.
		top := m
		if l.ProbeN != 0 {
			top = max(l.ProbeN, m)
			l.BatchTop, l.BatchAfter, l.BatchEnd, l.BatchUntil = top, l.CutSeq, seq, now+int64(l.Gap())
			l.BatchSeen, l.BatchN = [batchSeenMax]uint64{id}, 1
		}
		// A refusal never raises a ceiling (one over Hi is a retest; a
		// start of a fleet's process over it was made under a limit that
		// process had before).
		l.Hi = min(l.Hi, max(top-1, l.Lo, l.Floor), l.Ceil)
		l.Lo = min(max(m-1, l.Lo, l.Floor), l.Hi)
		l.HiAt, l.CutSeq = found(now), seq
		l.ProbeN, l.Step = 0, 1
		return
	}
	l.Streak++
	l.BatchTop = 0
	switch {
	case l.Streak <= 2:
		// The first refusals since an admission may be noise: over a
		// network the upstream lets a request go a moment before its
		// client sees the end, so a count the client saw admitted may
		// have been one or two more than the upstream had. A step down,
		// then two; the tests of the cut that follow tell a fall from
		// noise.
		l.Lo = m - l.Streak
	case l.Streak == 3:
		// Refused a third time before any admission: the cap fell, by
		// how much is unknown (a drop is usually large).
		l.Lo = m / 2
	default:
		l.Lo = m - 1<<(l.Streak-3)
	}
	l.Lo = min(max(l.Lo, l.Floor), l.Ceil)
	l.Hi = max(min(m-1, l.Ceil), l.Lo)
	l.HiAt, l.CutSeq = found(now), seq
	l.ProbeN, l.Step = 0, 1
}

// found is HiAt for a ceiling or cut found at now: never 0, which says
// none was found (see Configure), also for one found at a clock's start.
func found(now int64) int64 { return max(now, 1) }

// countBatch counts a refusal of start number id, made with m in flight,
// if it is one of the refused batch's starts and was not counted yet (the
// fleet may apply a refusal again): one fewer fits under the batch's top.
func (l *Cap) countBatch(m int, id uint64) {
	if l.BatchTop == 0 || l.Streak > 0 || id <= l.BatchAfter || id > l.BatchEnd || m <= l.BatchLo || m > l.BatchTop {
		return
	}
	if l.BatchN >= len(l.BatchSeen) || slices.Contains(l.BatchSeen[:l.BatchN], id) {
		return
	}
	l.BatchSeen[l.BatchN] = id
	l.BatchN++
	l.Hi = min(l.Hi, max(l.BatchTop-l.BatchN, l.BatchLo, l.Floor), l.Ceil)
	l.Lo = min(l.Lo, l.Hi)
}

// reopenedBy reports whether start number id is one of those counted by the
// last reopening of the ceiling (see raise), with no ceiling, cut or
// refused batch since (a refused batch leaves a refusal seen).
func (l *Cap) reopenedBy(id uint64) bool {
	return l.Hi == l.Ceil && l.Streak == 0 && l.BatchTop == 0 && l.BatchN == 0 && l.CutSeq == l.BatchEnd &&
		l.BatchAfter < id && id <= l.BatchEnd
}

// Bounds of Gap, and its value before any refusal was timed.
const (
	minGap     = 20 * time.Millisecond
	maxGap     = 2 * time.Second
	initialGap = 500 * time.Millisecond
)

// timeRefusal takes d, the time a refusal took, into the refusal time and
// its deviation, from which Gap follows. A refusal slower than maxGap
// counts as maxGap, so that one reported very late (say, after its client
// stalled) does not hold Gap at its bound for long; one of no time at all
// (a virtual clock's) counts as a nanosecond, so that Refusal is 0 only
// while none has been timed.
func (l *Cap) timeRefusal(d time.Duration) {
	d = min(max(d, 1), maxGap)
	if l.Refusal == 0 {
		l.Refusal, l.RefusalDev = d, d/2
	} else {
		l.RefusalDev = (3*l.RefusalDev + (l.Refusal - d).Abs()) / 4
		l.Refusal = (3*l.Refusal + d) / 4
	}
}

// Gap is how long a probe goes unanswered before it counts as admitted,
// set from the refusal time and its deviation as TCP sets its
// retransmission timeout from round trips (RFC 6298): a probe is taken as
// admitted once its refusal is later than nearly any seen, however much
// they vary, within [minGap, maxGap]. While they vary little, that is
// twice the time a refusal takes; after the first refusal, three times it.
func (l *Cap) Gap() time.Duration {
	if l.Refusal == 0 {
		return initialGap
	}
	gap := max(2*l.Refusal, l.Refusal+4*l.RefusalDev)
	return min(max(gap, minGap), maxGap)
}

// Inconclusive notes that start number id, made at with n in flight, was
// refused for another cap or failed: if it was a probe of this one, its
// batch proves nothing and is withdrawn; if it tested a cut, the next start
// tests it again.
func (l *Cap) Inconclusive(n int, id uint64, at int64) {
	if id <= l.CutSeq {
		return // started before the last cut: not one of its probes, nor its test
	}
	if l.ProbeN != 0 && (n > l.Lo || l.Streak > 0 && n == l.ProbeN && at == l.ProbeAt) {
		l.ProbeN = 0
	}
}

// Overloaded lowers Lo by a tenth (at least one), leaving the ceiling, once
// per burst: an answer to a start numbered id, made before the last cut
// (seq is the last start's number now), is of a burst already counted.
func (l *Cap) Overloaded(id, seq uint64) {
	if id <= l.CutSeq {
		return // the burst it belongs to has cut the cap already
	}
	l.Lo = max(l.Lo-max(1, l.Lo/10), l.Floor)
	l.ProbeN, l.Step, l.BatchTop = 0, 1, 0
	l.CutSeq = seq
}

// Valid reports whether l is a state a Cap can be in, its bounds aside
// (Configure applies them): one decoded from elsewhere may not be.
func (l *Cap) Valid() bool {
	return l.Lo >= 1 && l.Hi >= 1 && l.Step >= 1 && l.Step <= maxStep && l.Streak >= 0 &&
		l.Refusal >= 0 && l.Refusal <= maxGap && l.RefusalDev >= 0 && l.RefusalDev <= maxGap &&
		l.BatchLo >= 0 && l.BatchTop >= 0 && l.BatchN >= 0 && l.BatchN <= len(l.BatchSeen) &&
		l.ProbeN >= 0 && l.ProbeTop >= 0 && l.Retest >= 0
}
