package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/learn"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A learned key's cap is one state for the whole fleet, kept in Redis at
// <prefix>{<name>}#learn:<key name> as JSON: one decision, fed by every
// process's evidence. Each process keeps a copy, applies its own evidence
// to it at once (so its next admission runs under it), and writes the
// evidence to Redis in the background: it reads the state under WATCH,
// applies the evidence not yet written, and writes the result if it
// changed, publishing the key's name on <prefix>{<name>}#learned so that
// the other processes read it again. Most answers change nothing (an
// admission within the cap), so writes are few: the tests of the cap, and
// what they find.
//
// The evidence is the fleet's: an admission's count is the key's lease
// count in Redis with it, and its number is the server's time in
// microseconds, which orders starts across the fleet. Times are the
// server's, as the replies tell it (see clock.go).

// storedCap is a learned state as Redis keeps it, and as a message on the
// learned channel carries it: its key's name, its version (each write adds
// one), and the cap.
type storedCap struct {
	Key string    `json:"k"`
	V   uint64    `json:"v"`
	Cap learn.Cap `json:"cap"`
}

// learnedStateTTL is how long a learned state is kept in Redis unwritten:
// a cap nobody has tested for this long is learned anew.
const learnedStateTTL = 24 * time.Hour

// learnRefresh is how often at most a process reads a learned state that
// no message told it had changed: a message can be lost.
const learnRefresh = time.Second

// maxLearnPending bounds the evidence waiting to be written per key, while
// Redis is unreachable: the oldest goes first.
const maxLearnPending = 256

// learning is a key whose cap is learned. Guarded by r.mu.
type learning struct {
	name     string // the key's name (Keys.Name)
	stateKey string
	settings learn.Settings
	cap      learn.Cap    // base with pending applied: the cap this process admits under
	base     learn.Cap    // as last read from or written to Redis (or initial)
	pending  []learnEvent // applied to cap, not yet to Redis; oldest first
	queued   uint64       // the events ever queued: pending are the last of them
	stale    bool         // Redis may have a newer state
	known    bool         // base was read from or written to Redis
	version  uint64       // base's (see storedCap)
	readAt   time.Time    // when the state was last read or written
	applied  int          // the limit last set on the local registry (-1: none)
	syncing  bool         // a write of pending is under way
	// told is the cap and ceiling last logged; answers counts the
	// answers reported, by kind.
	told    [2]int
	changes uint64
	answers pacing.Learned
}

// eventKind is what a learnEvent tells.
type eventKind uint8

const (
	evStarted eventKind = iota
	evAdmitted
	evRefused
	evInconclusive
	evOverloaded
	evTick
)

var eventNames = [...]string{"a start", "an admission", "a refusal", "no evidence", "an overload", "a probe unanswered"}

func (k eventKind) String() string { return eventNames[k] }

// learnEvent is one piece of evidence about a learned cap.
type learnEvent struct {
	kind    eventKind
	n       int    // the key's count with the start
	id      uint64 // the start's number
	seq     uint64 // the last start's number when the answer came (refusals, overloads)
	at, now int64  // the start's time and the event's, server nanoseconds
}

func (e learnEvent) apply(c *learn.Cap) {
	switch e.kind {
	case evStarted:
		c.Started(e.n, e.now)
	case evAdmitted:
		c.Admitted(e.n, e.id)
	case evRefused:
		c.Refused(e.n, e.id, e.at, e.now, e.seq)
	case evInconclusive:
		c.Inconclusive(e.n, e.id)
	case evOverloaded:
		c.Overloaded(e.id, e.seq)
	case evTick:
		c.Tick(e.now)
	}
}

// start is what an admission in Redis tells a learned cap: the number of
// the start and each key's count with it.
type start struct {
	id     uint64
	at     int64   // server nanoseconds
	counts []int64 // per key of the lease
}

// Learn makes key's limit a cap learned from the upstream's answers, which
// the callers tell with Report, and shared by every process of the fleet:
// a refusal reported by one process lowers the cap for all, and what any
// of them learns, all use. The cap moves within a's bounds (see
// pacing.AdaptiveConfig); a limit set with SetLimit, or given by the
// LimitFunc or the default limit, stays its ceiling. Every process must
// learn the same keys with the same settings, as it sets the same limits.
// Learn on a key learned already applies a's settings to it. While Redis
// is unreachable each process goes on under the cap as it last knew it.
//
// It fails if a is not valid under the key's limit, if the key is not
// valid (see WithMaxKeyBytes), or with ErrClosed.
func (r *Registry[K]) Learn(key K, a pacing.AdaptiveConfig) error {
	if err := r.validKey(key); err != nil {
		return err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	configured := r.configuredLocked(key)
	if err := a.Validate(configured); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("fleet: Learn %s: %w", r.keyName(key), err)
	}
	s := learn.Settings{Min: a.Min, Max: a.Max, Initial: a.Initial, Retest: time.Duration(a.RetestMS) * time.Millisecond}
	lk := r.learning[key]
	if lk == nil {
		name := r.keyName(key)
		lk = &learning{name: name, stateKey: r.learnPrefix + name, cap: *s.New(configured), applied: -1}
		lk.base, lk.told = lk.cap, [2]int{lk.cap.Lo, lk.cap.Hi}
		if r.learning == nil {
			r.learning, r.learnedBy = map[K]*learning{}, map[string]K{}
		}
		r.learning[key], r.learnedBy[name] = lk, key
	}
	lk.settings = s
	s.Configure(&lk.cap, configured)
	lk.stale = true
	r.mu.Unlock()
	r.applyLearned(key)
	r.kickLearner()
	return nil
}

// Forget returns key to the limit it has without learning.
func (r *Registry[K]) Forget(key K) {
	r.mu.Lock()
	lk := r.learning[key]
	if lk != nil {
		delete(r.learning, key)
		delete(r.learnedBy, lk.name)
	}
	n := r.limitLocked(key)
	r.mu.Unlock()
	if lk != nil {
		r.setLocalLimit(key, n)
		r.wakeAll()
	}
}

// configuredLocked returns key's limit without learning, as a learned
// cap's ceiling takes it (0: none).
func (r *Registry[K]) configuredLocked(key K) int {
	n := r.staticLimitLocked(key)
	if n == slots.Unlimited {
		return 0
	}
	return n
}

// learnedLimitLocked returns the limit of key if it is learned.
func (r *Registry[K]) learnedLimitLocked(key K) (int, bool) {
	lk := r.learning[key]
	if lk == nil {
		return 0, false
	}
	return lk.cap.Limit(r.clock.nanos()), true
}

// Report tells the Registry how the upstream answered the request that s
// was admitted for, with the verdict of pacing.Classify (or of
// pacing.ClassifyAsRead): call it once per Slot, as soon as the answer is
// known and before s is released. A report that lowers a cap writes it to
// Redis before it returns (within the call timeout), so that the fleet
// knows of it before s's release lets another request start. On a learned key an admission proves
// its cap; a concurrency refusal counts against the last learned key of
// the admission (list keys from the broadest to the most specific, as a
// provider before its model) and tells the others nothing; an overload
// lowers that key's cap a little; any other answer proves nothing (a test
// of the cap it was is withdrawn). A Slot never reported is taken as
// admitted a moment after its start. A Slot admitted while Redis was
// unreachable, a bypass, another Registry's Slot or a second report
// changes nothing.
func (r *Registry[K]) Report(s *slots.Slot, v pacing.Verdict) {
	if s == nil || s.Bypassed() {
		return
	}
	h := (*core.Handle)(s).Hold()
	l, _ := h.Owner.(*lease[K])
	if l == nil || l.r != r || l.hold != h {
		return
	}
	r.mu.Lock()
	if r.closed || l.answered || l.start.counts == nil || len(r.learning) == 0 {
		r.mu.Unlock()
		return
	}
	l.answered = true
	now := r.clock.nanos()
	seq := r.clock.startCeiling()
	var path [4]struct {
		lk *learning
		n  int
	}
	np := 0
	for i, k := range l.keys {
		if lk := r.learning[k]; lk != nil && np < len(path) {
			path[np].lk, path[np].n = lk, int(l.start.counts[i])
			np++
		}
	}
	var changed [len(path)]K
	nc, cut := 0, false
	ev := learnEvent{id: l.start.id, at: l.start.at, now: now, seq: seq}
	for i := range np {
		p := path[i]
		if int(v.Kind) < len(p.lk.answers.ByKind) {
			p.lk.answers.ByKind[v.Kind]++
		}
		e := ev
		e.n = p.n
		last := i == np-1
		switch {
		case v.Kind == pacing.Admitted:
			e.kind = evAdmitted
		case v.Kind == pacing.Concurrency && last:
			e.kind = evRefused
		case v.Kind == pacing.Overload && last:
			e.kind = evOverloaded
		case v.Kind == pacing.Concurrency, v.Kind == pacing.Other:
			e.kind = evInconclusive
		default:
			continue // a rate limit, a quota: not about this cap (a Gate pauses for them)
		}
		if r.noteLocked(p.lk, e) {
			changed[nc] = r.learnedBy[p.lk.name]
			nc++
			cut = cut || e.kind == evRefused || e.kind == evOverloaded
		}
	}
	r.mu.Unlock()
	for _, k := range changed[:nc] {
		r.applyLearned(k)
		if cut {
			// The fleet learns of a cut before this Slot's release lets
			// another start in: the other processes would start it under
			// the cap they knew.
			r.flushLearned(k)
		}
	}
	if nc > 0 {
		r.kickLearner()
	}
}

// flushLearned writes key's pending evidence to Redis now, on the caller's
// goroutine, unless a write of it is under way already.
func (r *Registry[K]) flushLearned(key K) {
	r.mu.Lock()
	lk := r.learning[key]
	if lk == nil || lk.syncing || r.closed {
		r.mu.Unlock()
		return
	}
	lk.syncing = true
	r.mu.Unlock()
	r.syncLearned(key, lk)
	r.applyLearned(key)
}

// startedLocked notes the admission of l in Redis on its learned keys.
func (r *Registry[K]) startedLocked(l *lease[K]) (changed bool) {
	for i, k := range l.keys {
		if lk := r.learning[k]; lk != nil {
			e := learnEvent{kind: evStarted, n: int(l.start.counts[i]), id: l.start.id, at: l.start.at, now: l.start.at}
			changed = r.noteLocked(lk, e) || changed
		}
	}
	return changed
}

// noteLocked applies e to lk's cap, and queues it for Redis if it changed
// the cap; it reports whether it did.
func (r *Registry[K]) noteLocked(lk *learning, e learnEvent) bool {
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
	r.toldLocked(lk, e.kind.String())
	return true
}

// toldLocked logs a change of lk's cap or ceiling since the last one logged.
func (r *Registry[K]) toldLocked(lk *learning, by string) {
	if lk.cap.Lo == lk.told[0] && lk.cap.Hi == lk.told[1] {
		return
	}
	lk.changes++
	r.cfg.log().Info("fleet: learned cap changed", slog.String("key", lk.name), slog.Int("old", lk.told[0]), slog.Int("new", lk.cap.Lo),
		slog.Int("old_ceiling", lk.told[1]), slog.Int("ceiling", lk.cap.Hi), slog.String("by", by))
	lk.told = [2]int{lk.cap.Lo, lk.cap.Hi}
}

// Learned returns the state of key's learned cap (Enabled false if it is
// not learned), as this process knows it, and the answers it reported.
func (r *Registry[K]) Learned(key K) pacing.Learned {
	r.mu.Lock()
	defer r.mu.Unlock()
	lk := r.learning[key]
	if lk == nil {
		return pacing.Learned{}
	}
	st := lk.answers
	st.Enabled = true
	st.Limit = lk.cap.Limit(r.clock.nanos())
	if c := r.configuredLocked(key); c > 0 {
		st.Limit = min(st.Limit, c)
	}
	st.Cap, st.Ceiling, st.Floor, st.Max, st.Changes = lk.cap.Lo, lk.cap.Hi, lk.cap.Floor, lk.cap.Ceil, lk.changes
	return st
}

// applyLearned sets key's limit in the local registry to its learned one,
// and wakes the waiters if it rose.
func (r *Registry[K]) applyLearned(key K) {
	r.learnMu.Lock()
	defer r.learnMu.Unlock()
	r.mu.Lock()
	lk := r.learning[key]
	if lk == nil {
		r.mu.Unlock()
		return
	}
	n := r.limitLocked(key)
	old := lk.applied
	lk.applied = n
	r.mu.Unlock()
	if n == old {
		return
	}
	r.local.SetLimit(key, n)
	if n > old {
		r.wakeAll()
	}
}

// setLocalLimit sets key's limit in the local registry, in the order of
// applyLearned's.
func (r *Registry[K]) setLocalLimit(key K, n int) {
	r.learnMu.Lock()
	defer r.learnMu.Unlock()
	r.local.SetLimit(key, n)
}

// kickLearner wakes the goroutine that writes and reads learned states.
func (r *Registry[K]) kickLearner() {
	select {
	case r.learnKick <- struct{}{}:
	default:
	}
}

// learner writes this process's evidence to Redis and reads the others',
// and moves the limits that change with time (a test of the cap that is
// due, a probe that went unanswered).
func (r *Registry[K]) learner() {
	defer r.done.Done()
	t := time.NewTimer(learnRefresh)
	defer t.Stop()
	for {
		select {
		case <-r.stopping.Done():
			return
		case <-r.learnKick:
		case <-t.C:
		}
		var next time.Duration
		r.survive("learning", func() { next = r.learnRound() })
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// learnRound does what is due for every learned key, and returns how long
// until something is due again.
func (r *Registry[K]) learnRound() time.Duration {
	next := learnRefresh
	type due struct {
		key K
		lk  *learning
	}
	var work []due
	r.mu.Lock()
	now := r.clock.nanos()
	for k, lk := range r.learning {
		if at := lk.cap.WakeAt(now); at != 0 {
			if at <= now {
				r.noteLocked(lk, learnEvent{kind: evTick, now: now})
			} else {
				next = min(next, time.Duration(at-now))
			}
		}
		if time.Since(lk.readAt) >= learnRefresh {
			lk.stale = true
		}
		if (lk.stale || len(lk.pending) > 0) && !lk.syncing {
			lk.syncing = true
			work = append(work, due{k, lk})
		}
	}
	r.mu.Unlock()
	for _, d := range work {
		if !r.syncLearned(d.key, d.lk) {
			next = min(next, r.cfg.probeEvery)
		}
	}
	// Each limit, which may have changed with time as well as evidence.
	r.mu.Lock()
	keys := make([]K, 0, len(r.learning))
	for k := range r.learning {
		keys = append(keys, k)
	}
	r.mu.Unlock()
	for _, k := range keys {
		r.applyLearned(k)
	}
	return max(next, time.Millisecond)
}

// syncLearned writes lk's pending evidence to Redis, or reads its state if
// there is none, and takes the result as its base. It reports whether
// Redis answered.
func (r *Registry[K]) syncLearned(key K, lk *learning) bool {
	r.mu.Lock()
	evs := append([]learnEvent(nil), lk.pending...)
	upto := lk.queued
	s, configured := lk.settings, r.configuredLocked(key)
	// Missing from Redis (it lost its data, or nobody has learned it for
	// learnedStateTTL), a state this process knew goes back: it is the
	// best knowledge there is.
	start, version := *s.New(configured), lk.version
	if lk.known {
		start = lk.base
		s.Configure(&start, configured)
	}
	r.mu.Unlock()
	var fresh storedCap
	ok := false
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		lk.syncing = false
		if !ok || r.learning[key] != lk {
			return
		}
		// pending holds the events numbered after queued-len(pending).
		written := upto - (lk.queued - uint64(len(lk.pending)))
		lk.pending = lk.pending[min(written, uint64(len(lk.pending))):]
		// A message may have brought a later version meanwhile, with what
		// was written here in it; else what Redis has is the state (after
		// a data loss its version may be lower than the one known here).
		if lk.version == version || fresh.V >= lk.version {
			lk.base, lk.version = fresh.Cap, fresh.V
		}
		lk.rebaseLocked()
		lk.stale, lk.readAt, lk.known = false, time.Now(), true
		r.toldLocked(lk, "read from redis")
	}()
	if !r.brk.allow() {
		return false
	}
	ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
	defer cancel()
	for try := 0; try < 8; try++ {
		err := r.rdb.Watch(ctx, func(tx *redis.Tx) error {
			fresh = storedCap{Key: lk.name, V: version, Cap: start}
			raw, err := tx.Get(ctx, lk.stateKey).Bytes()
			found := err == nil
			switch {
			case errors.Is(err, redis.Nil):
			case err != nil:
				return err
			default:
				var st storedCap
				if json.Unmarshal(raw, &st) == nil && st.Key == lk.name {
					fresh = st
					s.Configure(&fresh.Cap, configured)
				} else {
					found = false // not a state of ours: written over
				}
			}
			before := fresh.Cap
			for _, e := range evs {
				e.apply(&fresh.Cap)
			}
			if found && fresh.Cap == before {
				return nil
			}
			fresh.V++
			b, _ := json.Marshal(fresh) // plain numbers and a string: cannot fail
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, lk.stateKey, b, learnedStateTTL)
				p.Publish(ctx, r.learnChan, b)
				return nil
			})
			return err
		}, lk.stateKey)
		switch {
		case err == nil:
			ok = true
			return true
		case errors.Is(err, redis.TxFailedErr):
			continue // another process wrote it meanwhile: again, on its state
		}
		if ctx.Err() == nil {
			r.redisFailed(err)
		}
		return false
	}
	return true // written over and over by others: Redis answers
}

// learnedMessage takes a message on the learned channel: a state written,
// which this process takes if it is later than the one it has (one that
// cannot be read is read from Redis instead).
func (r *Registry[K]) learnedMessage(payload string) {
	var st storedCap
	bad := json.Unmarshal([]byte(payload), &st) != nil
	r.mu.Lock()
	k, ok := r.learnedBy[st.Key]
	switch {
	case bad:
		for _, lk := range r.learning {
			lk.stale = true
		}
	case ok:
		lk := r.learning[k]
		if st.V > lk.version {
			lk.settings.Configure(&st.Cap, r.configuredLocked(k))
			lk.base, lk.version, lk.known = st.Cap, st.V, true
			lk.rebaseLocked()
			r.toldLocked(lk, "another process")
		}
	}
	r.mu.Unlock()
	switch {
	case bad:
		r.kickLearner()
	case ok:
		r.applyLearned(k)
	}
}

// rebaseLocked makes lk's cap its base with the pending evidence on top.
func (lk *learning) rebaseLocked() {
	lk.cap = lk.base
	for _, e := range lk.pending {
		e.apply(&lk.cap)
	}
}

// learnedStale marks every learned state to be read again (a subscription
// made again may have missed messages).
func (r *Registry[K]) learnedStale() {
	r.mu.Lock()
	for _, lk := range r.learning {
		lk.stale = true
	}
	n := len(r.learning)
	r.mu.Unlock()
	if n > 0 {
		r.kickLearner()
	}
}

// reconfigureLocked applies key's limit without learning, as its ceiling,
// to its learned cap; it reports whether key is learned.
func (r *Registry[K]) reconfigureLocked(key K) bool {
	lk := r.learning[key]
	if lk == nil {
		return false
	}
	c := r.configuredLocked(key)
	lk.settings.Configure(&lk.cap, c)
	lk.settings.Configure(&lk.base, c)
	return true
}
