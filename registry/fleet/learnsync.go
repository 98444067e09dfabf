package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/inflight-go/inflight/internal/learn"
	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// A process writes its evidence to the store in the background (the learner
// goroutine), or at once for a cut (Report): it applies the evidence not
// yet written to the state it knows, and one script call (learnWriteScript)
// writes the result, with its version one higher, and publishes it on
// <prefix>{<name>}#learned, if the store still has that state's version; if
// not, the call returns the state the store has, and the process applies its
// evidence to that and tries again. A cut reaches the others in one round
// trip: with the three of a WATCH transaction, a fleet whose store took 5
// ms to answer drew seven times the 429s of one process
// (TestFleetLearningUnderRedisLatency). The other processes
// take a published state whose version is above theirs, without a read;
// each also reads every state once a learnRefresh, since a message can be
// lost, and that read keeps the state from expiring while it is in use.

// storedCap is a learned state as the store keeps it, and as a message on the
// learned channel carries it: its key's name, its version (each write's is
// over the one before and over the server's clock in microseconds), and
// the cap. Channels are not per database: a message tells the epoch of
// the data it was written in, and one of another epoch (another database,
// or one written before a data loss) is only a reason to read the state.
// In the store it is a storedRecord (format.go), not this struct.
type storedCap struct {
	Key string
	V   uint64
	E   int64 // the writer's epoch (see PROTOCOL.md); 0: not known
	F   int   // the format it was read in (0, none, and 1 are the first), or is to be written in (WithLearnedFormat)
	Cap learn.Cap
}

// learnedStateTTL is how long a learned state is kept in the store without a
// process learning it.
const learnedStateTTL = 24 * time.Hour

// learnRefresh is how often a process reads a learned state that no
// message told it had changed.
const learnRefresh = time.Second

// learnErrLogEvery is how often at most a failed write or read of a
// learned state is logged.
const learnErrLogEvery = 10 * time.Second

// staleLocked marks lk's state to be read again.
func (lk *learning) staleLocked() {
	lk.stale = true
	lk.staleN++
}

// rebaseLocked makes lk's cap its base with the pending evidence on top.
func (lk *learning) rebaseLocked() {
	lk.cap = lk.base
	for _, e := range lk.pending {
		e.apply(&lk.cap)
	}
}

// writtenLocked drops from lk's pending evidence the events up to upto
// (lk.queued when they were taken), which a sync has written. pending holds
// the events numbered after queued-len(pending).
func (lk *learning) writtenLocked(upto uint64) {
	first := lk.queued - uint64(len(lk.pending))
	if upto > first {
		lk.pending = lk.pending[min(upto-first, uint64(len(lk.pending))):]
	}
}

// kickLearner wakes the goroutine that writes and reads learned states.
func (r *Registry[K]) kickLearner() {
	select {
	case r.learned.learnKick <- struct{}{}:
	default:
	}
}

// learner writes this process's evidence to the store and reads the others',
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
		case <-r.learned.learnKick:
		case <-t.C:
		}
		next := learnRefresh
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
	due, keys := r.dueLocked(&next)
	for _, d := range due {
		ok := false
		r.survive("learning", func() { ok = r.syncLearned(d.key, d.lk) })
		if !ok {
			next = min(next, r.cfg.probeEvery)
		}
	}
	// Each limit, which may have changed with time as well as evidence.
	for _, k := range keys {
		r.applyLearned(k)
	}
	return max(next, time.Millisecond)
}

// dueKey is a learned key marked syncing, to write or read.
type dueKey[K comparable] struct {
	key K
	lk  *learning
}

// dueLocked notes what time has proved (a probe gone unanswered), and
// returns the keys to write or read now, marked syncing, and every learned
// key; it lowers *next to when a key's limit next changes with time.
func (r *Registry[K]) dueLocked(next *time.Duration) (due []dueKey[K], keys []K) {
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	now := r.clock.nanos()
	// Before a reply has told the server's clock, time proves nothing: a
	// probe in a state read from the store was timed by another clock.
	timed := r.clock.told()
	for k, lk := range c.learning {
		keys = append(keys, k)
		if at := lk.cap.WakeAt(now); at != 0 && timed {
			if at <= now {
				c.noteLocked(lk, learnEvent{kind: evTick, now: now, seq: r.clock.startCeiling()})
			} else {
				*next = min(*next, time.Duration(at-now))
			}
		}
		if time.Since(lk.readAt) >= learnRefresh {
			lk.staleLocked()
		}
		if (lk.stale || len(lk.pending) > 0) && !lk.syncing {
			lk.syncingLocked()
			due = append(due, dueKey[K]{k, lk})
		}
	}
	return due, keys
}

// syncingLocked marks lk's state as being written or read.
func (lk *learning) syncingLocked() {
	lk.syncing = true
	lk.synced = make(chan struct{})
}

// flushLearned writes key's pending evidence to the store now, on the caller's
// goroutine, after a write or read of it under way ends, within the call
// timeout.
func (r *Registry[K]) flushLearned(key K) {
	timeout := time.NewTimer(r.cfg.opTimeout)
	defer timeout.Stop()
	c := &r.learned
	for {
		c.mu.Lock()
		lk := c.learning[key]
		if lk == nil || c.closed || len(lk.pending) == 0 {
			c.mu.Unlock()
			return
		}
		if !lk.syncing {
			lk.syncingLocked()
			c.mu.Unlock()
			r.syncLearned(key, lk)
			r.applyLearned(key)
			return
		}
		synced := lk.synced
		c.mu.Unlock()
		select {
		case <-synced: // it may have written this evidence; if not, again
		case <-timeout.C:
			return
		case <-r.stopping.Done():
			return
		}
	}
}

// syncSnapshot is what a write or read of a learned state starts from.
type syncSnapshot struct {
	lk          *learning
	evs         []learnEvent
	upto        uint64 // lk.queued when evs were taken
	gen, staleN uint64
	s           learn.Settings
	configured  int
	start       storedCap // the state known here, configured: to write if the store has none
	stored      storedCap // start as the store has it (known) or had it (unconfigured)
	known       bool      // start is the state last read from or written to the store
}

// syncLearned writes the pending evidence of key, learned as lk, to the store,
// or reads its state if there is none, and takes the result as its base;
// the caller has marked lk syncing. It reports whether the store answered.
func (r *Registry[K]) syncLearned(key K, lk *learning) bool {
	var (
		snap  = syncSnapshot{lk: lk}
		fresh storedCap
		done  bool
	)
	// Whatever happens (a LimitFunc or a client hook may panic, the key be
	// forgotten meanwhile), the sync ends.
	defer func() { r.syncedLocked(key, snap, fresh, done) }()
	var learned bool
	if snap, learned = r.snapshotLocked(key, lk); !learned {
		return true // forgotten
	}
	if !r.brk.allow() {
		return false
	}
	ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
	defer cancel()
	var err error
	fresh, done, err = r.writeLearned(ctx, snap)
	if err == nil {
		return true // done, or written over and over by others: the store answers
	}
	later := errors.Is(err, errLearnedFormat)
	if ctx.Err() == nil && r.learned.learnErrLog.Allow(time.Now().UnixNano(), learnErrLogEvery) {
		msg := "fleet: learned cap not written to the store; this process goes on with its own"
		if later {
			msg = "fleet: learned cap left in the store as a later release wrote it; this process goes on with its own"
		}
		r.logSafely(slog.LevelWarn, msg, slog.String("registry", r.prefix), slog.String("key", snap.lk.name), slog.Any("error", err))
	}
	return later // the store answered: read again at the usual pace
}

// snapshotLocked takes what a sync of key, learned as lk, starts from;
// false if key is no longer learned as lk.
func (r *Registry[K]) snapshotLocked(key K, lk *learning) (syncSnapshot, bool) {
	r.mu.Lock()
	defer r.mu.Unlock() // the LimitFunc may panic
	if r.learned.of(key) != lk {
		return syncSnapshot{lk: lk}, false
	}
	configured := r.configuredLocked(key)
	r.learned.mu.Lock()
	defer r.learned.mu.Unlock()
	snap := syncSnapshot{lk: lk, evs: append([]learnEvent(nil), lk.pending...), upto: lk.queued, gen: lk.gen, staleN: lk.staleN,
		s: lk.settings, configured: configured}
	// Missing from the store (it lost its data, or nobody has learned it for
	// learnedStateTTL), a state this process knew goes back: it is the
	// best knowledge there is.
	snap.start = storedCap{Key: lk.name, V: lk.stored.V, Cap: *snap.s.New(snap.configured)}
	if lk.known {
		snap.known = true
		snap.stored = lk.stored
		snap.start.Cap = lk.stored.Cap
		snap.s.Configure(&snap.start.Cap, snap.configured)
	}
	return snap, true
}

// maxLearnTries bounds the tries of a sync that other processes' writes
// keep beating.
const maxLearnTries = 8

// storeState is what a sync knows of the state in the store: stored, as the store
// has it, and st, configured here, if it is a valid state of the key
// (found); v is its version as the write script tells it; known false:
// nothing yet.
type storeState struct {
	stored, st storedCap
	found      bool
	v          string
	known      bool
}

// writeLearned writes snap's evidence to the store, applied to the state there,
// each try a round trip: the first presumes the state this process knows
// (if it knows one), and a try that finds another returns it for the next.
// It returns the state the store has once it is done (done), as the store has it,
// and the error of a call that failed. Not done without an error: others
// wrote it over and over.
func (r *Registry[K]) writeLearned(ctx context.Context, snap syncSnapshot) (fresh storedCap, done bool, err error) {
	cur := storeState{st: snap.start}
	if snap.known {
		cur.stored, cur.found, cur.v, cur.known = snap.stored, true, strconv.FormatUint(snap.stored.V, 10), true
	}
	for try := range maxLearnTries {
		payload := ""
		next := cur.st
		if cur.known {
			for _, e := range snap.evs {
				e.apply(&next.Cap)
			}
			switch {
			case !cur.found || next.Cap != cur.st.Cap || cur.stored.F > r.cfg.learnedFormat:
				// Evidence to write, or a state in a later format than
				// this process writes (WithLearnedFormat): written in its
				// own. Versions follow the server's clock as well as
				// each other: after a data loss, a state written anew
				// still comes after those before.
				next.V = max(cur.st.V+1, r.clock.startCeiling())
				next.E, next.F = r.epoch.Load(), r.cfg.learnedFormat
				b, _ := json.Marshal(next) // numbers and a string: cannot fail
				payload = string(b)
			case try > 0:
				// Nothing to write on the state the try before found (and
				// kept from expiring).
				return cur.stored, true, nil
			}
			// Else a read of the state presumed, to find whether another
			// process wrote it, and keep it from expiring.
		}
		call := &driver.LearnedCall{Key: snap.lk.name, Presumed: cur.v, State: payload, TTL: learnedStateTTL}
		res, err := r.store.SyncLearned(ctx, call)
		if err != nil {
			return fresh, false, err
		}
		if res.Wrote {
			if res.PublishErr != "" && r.learned.learnErrLog.Allow(time.Now().UnixNano(), learnErrLogEvery) {
				r.logSafely(slog.LevelWarn, "fleet: learned cap written to the store and not published; the other processes read it within a second",
					slog.String("registry", r.prefix), slog.String("key", snap.lk.name), slog.String("error", res.PublishErr))
			}
			return next, true, nil
		}
		if _, f, ok := learnedFormatOf(res.State); res.Found && ok && f > learnedFormat {
			return fresh, false, fmt.Errorf("%w (its format: %s; this process reads up to %d)", errLearnedFormat, formatName(f), learnedFormat)
		}
		cur = r.decodeLearned(snap, res)
	}
	return fresh, false, nil
}

// decodeLearned reads the store's state res, which is not the one the
// caller presumed.
func (r *Registry[K]) decodeLearned(snap syncSnapshot, res driver.LearnedResult) storeState {
	cur := storeState{st: snap.start, known: true, v: res.Version}
	if !res.Found {
		return cur // no state: snap.start goes back
	}
	var st storedCap
	if json.Unmarshal([]byte(res.State), &st) == nil && st.Key == snap.lk.name && st.Cap.Valid() {
		cur.stored, cur.st, cur.found = st, st, true
		snap.s.Configure(&cur.st.Cap, snap.configured)
	}
	return cur // not a state of ours: written over
}

// syncedLocked ends a sync of key from snap: with done, the store has fresh,
// which becomes the base, with the evidence queued meanwhile on top.
func (r *Registry[K]) syncedLocked(key K, snap syncSnapshot, fresh storedCap, done bool) {
	c, lk := &r.learned, snap.lk
	// The sync ends whatever happens: if the LimitFunc panics, after the
	// Registry's mu is unlocked, with what it wrote no longer pending (a
	// cap that took this write's message before it, with that evidence
	// twice, stays so until the next sync then).
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if done {
			lk.writtenLocked(snap.upto)
		}
		if lk.syncing {
			lk.syncing = false
			close(lk.synced)
		}
	}()
	if !done {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock() // the LimitFunc may panic
	if c.of(key) != lk {
		return
	}
	configured := r.configuredLocked(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.learning[key] != lk { // forgotten meanwhile
		return
	}
	lk.writtenLocked(snap.upto)
	// A message may have brought a later version meanwhile, with what was
	// written here in it; else what the store has is the state (after a data
	// loss its version may be lower than the one known here).
	if lk.stored.V == snap.start.V || fresh.V >= lk.stored.V {
		lk.stored, lk.base = fresh, fresh.Cap
		lk.settings.Configure(&lk.base, configured)
	}
	if lk.gen != snap.gen { // configured anew meanwhile
		lk.staleLocked()
	}
	lk.rebaseLocked()
	lk.known, lk.readAt = true, time.Now()
	if lk.staleN == snap.staleN { // else a message (or Learn) came meanwhile: read again
		lk.stale = false
	}
	c.toldLocked(lk, "the fleet's state")
}
