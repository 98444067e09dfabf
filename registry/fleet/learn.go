package fleet

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/learn"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// A learned key's cap is one state for the whole fleet, kept in the store at
// <prefix>{<name>}#learn:<key name>: one decision, fed by every process's
// evidence. Each process keeps a copy, applies its own evidence to it at
// once (so that its next admission runs under it), and writes the
// evidence to the store in the background (see learnsync.go). Most answers
// change nothing (an admission within the cap), so writes are few: the
// tests of the cap, and what they find.
//
// The evidence is the fleet's: an admission's count is the key's lease
// count in the store with it, and its number is the server's time in
// microseconds, which orders starts across the fleet. Times are the
// server's, as the replies tell it (see clock.go).

// maxLearnPending bounds the evidence waiting to be written per key, while
// the store is unreachable: the oldest goes first.
const maxLearnPending = 256

// learning is a key whose cap is learned. Guarded by the learned caps' mu
// (see learnedCaps).
type learning struct {
	name     string // the key's name (Keys.Name)
	settings learn.Settings
	gen      uint64    // counts the settings and ceilings applied (see syncLearned)
	cap      learn.Cap // base with pending applied: the cap this process admits under
	base     learn.Cap // stored's, configured here (or initial)
	stored   storedCap // as last read from or written to the store, as the store has it
	known    bool      // base was read from or written to the store
	// pending is the evidence applied to cap and not yet written to
	// the store, oldest first; queued counts the events ever queued, of
	// which pending are the last.
	pending []learnEvent
	queued  uint64
	stale   bool   // the store may have a newer state
	staleN  uint64 // counts the times stale was set (see syncLearned)
	readAt  time.Time
	syncing bool          // a write or read of the state is under way
	synced  chan struct{} // closed when it ends
	applied int           // the limit last set on the local registry (-1: none)
	// told is the cap and ceiling last logged; answers counts the
	// answers reported, by kind.
	told    [2]int
	changes uint64
	answers upstream.Learned
}

// eventKind is what a learnEvent tells.
type eventKind uint8

const (
	evAnswer  eventKind = iota // an answer, as its step tells
	evStarted                  // a start in the store
	evTick                     // time passed without an answer to a probe
)

// String names e in a log line.
func (e learnEvent) String() string {
	switch e.kind {
	case evStarted:
		return "a start"
	case evTick:
		return "a probe unanswered"
	}
	return stepNames[e.step]
}

var stepNames = [...]string{learn.Withdrawn: "no evidence", learn.Proved: "an admission",
	learn.Cut: "a refusal", learn.Eased: "an overload"}

// learnEvent is one piece of evidence about a learned cap.
type learnEvent struct {
	kind    eventKind
	step    learn.Step // of an evAnswer
	n       int        // the key's count with the start
	id      uint64     // the start's number
	seq     uint64     // the last start's number when the answer came (or the tick)
	at, now int64      // the start's time and the event's, server nanoseconds
}

// apply applies e to c.
func (e learnEvent) apply(c *learn.Cap) {
	switch e.kind {
	case evStarted:
		// A start from before the last cut is neither a probe nor the
		// cut's test: written late (a cut is written at once, a start in
		// the background), it would undo the cut.
		if e.id > c.CutSeq {
			c.Started(e.n, e.now)
		}
	case evAnswer:
		c.Take(learn.Answer{Step: e.step, N: e.n, ID: e.id, Seq: e.seq, At: e.at, Now: e.now})
	case evTick:
		c.Tick(e.now, e.seq)
	}
}

// start is what an admission in the store tells a learned cap: the number of
// the start and each key's count with it.
type start struct {
	id     uint64
	at     int64   // server nanoseconds
	counts []int64 // per key of the lease
}

// learnChange is a change of a learned cap, to log once the learned caps'
// mu is unlocked.
type learnChange struct {
	key                        string
	old, cap, oldCeiling, ceil int
	by                         string
}

// Learn makes key's limit a cap learned from the upstream's answers, which
// the callers tell with Report, and shared by every process of the fleet:
// a refusal reported by one process lowers the cap for all, and what any
// of them learns, all use. The cap moves within a's bounds (see
// pacing.AdaptiveConfig); a limit set with SetLimit, or given by the
// LimitFunc or the default limit, stays its ceiling. Every process must
// learn the same keys with the same settings, as it sets the same limits.
// Learn on a key learned already applies a's settings to it. While the store
// is unreachable each process goes on under the cap as it last knew it;
// evidence not written to the store by Close is dropped.
//
// It fails if a is not valid under the key's limit, if the key is not
// valid (see registry.WithMaxKeyBytes) or its name is not UTF-8 (the stored state
// names it in JSON) or starts with a NUL and "overrides/" (the name of an
// Overrides' record), or with ErrClosed.
func (r *Registry[K]) Learn(key K, a upstream.AdaptiveConfig) error {
	if err := r.validKey(key); err != nil {
		return err
	}
	if name := r.keyName(key); !utf8.ValidString(name) {
		return fmt.Errorf("%w: fleet: Learn %q: the name is not UTF-8", registry.ErrInvalidKey, name)
	} else if strings.HasPrefix(name, overridesPrefix) {
		return fmt.Errorf("%w: fleet: Learn %q: the name starts as the overrides' record does", registry.ErrInvalidKey, name)
	}
	if err := r.learnLocked(key, a); err != nil {
		return err
	}
	r.applyLearned(key)
	r.kickLearner()
	return nil
}

func (r *Registry[K]) learnLocked(key K, a upstream.AdaptiveConfig) error {
	name := r.keyName(key)
	r.mu.Lock()
	defer r.mu.Unlock() // the LimitFunc may panic
	if r.closed {
		return ErrClosed
	}
	configured := r.configuredLocked(key)
	if err := a.Validate(configured); err != nil {
		return fmt.Errorf("fleet: Learn %s: %w", name, err)
	}
	s := learn.FromMS(a.Min, a.Max, a.Initial, a.RetestMS)
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	lk := c.learning[key]
	if lk == nil {
		lk = &learning{name: name, cap: *s.New(configured), applied: -1}
		lk.base, lk.told = lk.cap, [2]int{lk.cap.Lo, lk.cap.Hi}
		lk.changes = 1 // the first setting, as upstream.Learned counts it
		if c.learning == nil {
			c.learning, c.learnedBy = map[K]*learning{}, map[string]K{}
		}
		c.learning[key], c.learnedBy[name] = lk, key
		c.ever.Store(true)
	}
	lk.settings = s
	lk.configureLocked(configured)
	lk.staleLocked()
	return nil
}

// Forget returns key to the limit it has without learning.
func (r *Registry[K]) Forget(key K) {
	if r.validKey(key) == nil && r.learned.forget(key) {
		r.forgetLocal(key)
		r.wakeAll()
	}
}

// forgetLocal gives key in the local registry the limit it has without
// learning, in order with SetLimit's settings of it.
func (r *Registry[K]) forgetLocal(key K) {
	r.learned.learnMu.Lock()
	defer r.learned.learnMu.Unlock()
	n, set := func() (int, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		n, set := r.limits[key]
		return n, set
	}()
	if r.learned.of(key) != nil {
		return // learned again: its Learn applies the learned limit
	}
	if set {
		r.local.SetLimit(key, n)
	} else {
		r.local.ClearLimit(key) // the default or the LimitFunc again
	}
}

// Report tells the Registry how the upstream answered the request that s
// was admitted for, with the verdict of pacing.Classify (or of
// pacing.ClassifyAsRead): call it once per Slot, as soon as the answer is
// known and before s is released. On a learned key an admission proves
// its cap; a concurrency refusal counts against the last learned key of
// the admission (list keys from the broadest to the most specific, as a
// provider before its model) and tells the others nothing; an overload
// lowers that key's cap a little; any other answer proves nothing (a test
// of the cap it was is withdrawn). A Slot never reported is taken as
// admitted a moment after its start. A Slot admitted while the store was
// unreachable, a bypass, another Registry's Slot or a second report
// changes nothing.
//
// A report that lowers a cap writes it to the store before it returns, within
// the call timeout, and the other processes take it as its message
// arrives: so s's release, which follows, lets few of them start another
// request under the cap they knew. An admission whose reply comes after
// the cut, at a count over it, is not handed out (see PROTOCOL.md).
func (r *Registry[K]) Report(s *slots.Slot, v upstream.Verdict) {
	if s == nil || s.Bypassed() || !r.learned.ever.Load() {
		return
	}
	h := (*core.Handle)(s).Hold()
	l, _ := h.Owner.(*lease[K])
	if l == nil || l.r != r || l.hold != h {
		return
	}
	changed, cut := r.reportLocked(l, v)
	for _, k := range changed {
		r.applyLearned(k)
		if cut {
			r.flushLearned(k)
		}
	}
	if len(changed) > 0 {
		r.kickLearner()
	}
}

// reportLocked applies the verdict v on l to its learned keys, and returns
// the keys whose caps changed and whether one was cut.
func (r *Registry[K]) reportLocked(l *lease[K], v upstream.Verdict) (changed []K, cut bool) {
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || l.answered || l.start.counts == nil || len(c.learning) == 0 {
		return nil, false
	}
	l.answered = true
	last := -1 // the last learned key: a refusal's
	for i, k := range l.keys {
		if c.learning[k] != nil {
			last = i
		}
	}
	ev := learnEvent{id: l.start.id, at: l.start.at, now: r.clock.nanos(), seq: r.clock.startCeiling()}
	for i, k := range l.keys {
		lk := c.learning[k]
		if lk == nil {
			continue
		}
		if int(v.Kind) < len(lk.answers.ByKind) {
			lk.answers.ByKind[v.Kind]++
		}
		e := ev
		e.n = int(l.start.counts[i])
		e.step = learn.Route(learn.Kind(v.Kind), i == last)
		if c.noteLocked(lk, e) {
			changed = append(changed, k)
			cut = cut || e.step == learn.Cut || e.step == learn.Eased
		}
	}
	return changed, cut
}

// started notes the admission of l in the store on its learned keys; it
// reports whether a cap changed.
func (r *Registry[K]) started(l *lease[K]) (changed bool) {
	if !r.learned.ever.Load() {
		return false
	}
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range l.keys {
		if lk := c.learning[k]; lk != nil {
			e := learnEvent{kind: evStarted, n: int(l.start.counts[i]), id: l.start.id, at: l.start.at, now: l.start.at}
			changed = c.noteLocked(lk, e) || changed
		}
	}
	return changed
}

// noteLocked applies e to lk's cap, and queues it for the store if it changed
// the cap; it reports whether it did.
func (c *learnedCaps[K]) noteLocked(lk *learning, e learnEvent) bool {
	before := lk.cap
	e.apply(&lk.cap)
	if lk.cap == before {
		return false
	}
	if len(lk.pending) >= maxLearnPending {
		lk.pending = lk.pending[1:]
	}
	lk.pending = append(lk.pending, e)
	lk.queued++
	c.toldLocked(lk, e.String())
	return true
}

// toldLocked queues a change of lk's cap or ceiling since the last one
// told, to be logged after the lock (see applyLearned).
func (c *learnedCaps[K]) toldLocked(lk *learning, by string) {
	if lk.cap.Lo == lk.told[0] && lk.cap.Hi == lk.told[1] {
		return
	}
	lk.changes++
	if len(c.learnLog) < maxLearnPending {
		c.learnLog = append(c.learnLog, learnChange{key: lk.name, old: lk.told[0], cap: lk.cap.Lo, oldCeiling: lk.told[1], ceil: lk.cap.Hi, by: by})
	}
	lk.told = [2]int{lk.cap.Lo, lk.cap.Hi}
}

// logLearned logs the changes queued by toldLocked.
func (r *Registry[K]) logLearned() {
	c := &r.learned
	c.mu.Lock()
	changes := c.learnLog
	c.learnLog = nil
	c.mu.Unlock()
	for _, c := range changes {
		r.logSafely(slog.LevelInfo, "fleet: learned cap changed", slog.String("registry", r.prefix), slog.String("key", c.key),
			slog.Int("old", c.old), slog.Int("new", c.cap), slog.Int("old_ceiling", c.oldCeiling), slog.Int("ceiling", c.ceil), slog.String("by", c.by))
	}
}

// Learned returns the state of key's learned cap (Enabled false if it is
// not learned), as this process knows it, and the answers it reported.
func (r *Registry[K]) Learned(key K) (st upstream.Learned) {
	r.withLearned(key, func(lk *learning, limit int) {
		st = lk.answers
		st.Enabled, st.Limit = true, limit
		st.Cap, st.Ceiling, st.Floor, st.Max, st.Changes = lk.cap.Lo, lk.cap.Hi, lk.cap.Floor, lk.cap.Ceil, lk.changes
	})
	return st
}
