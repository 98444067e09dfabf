// Package memstore is a fleet's store in one process's memory: the
// contract of package driver, written out plainly in Go, for tests of
// code that uses package fleet (a fleet of Registries in one test, no
// server) and as a reference for the writer of a store. It passes the
// conformance suite (package fleettest), faults included. It is not
// shared between processes, and keeps nothing across a restart.
//
//	store := memstore.New()
//	a := fleet.New[string](store, 2) // two "processes" of one fleet
//	b := fleet.New[string](store, 2)
//
// Its queue orders waiters as the contract says (class, then the flows'
// weighted turns, then arrival) and hands freed room to the first waiter
// that can take it on all of its keys. Unlike the Redis and PostgreSQL
// stores it looks at every waiter when it serves a queue, and keeps no
// place for a waiter of several keys passed over many times.
package memstore

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Store is a fleet's store in memory. Its methods may be called from many
// goroutines at once.
type Store struct {
	mu    sync.Mutex
	clock func() time.Time
	data  data
	subs  map[*sub]struct{}
	down  error         // Kill: every call fails with it until Restart
	hang  chan struct{} // Stop: calls wait until Cont closes it
	// lastEpoch is the latest epoch made, kept across losses: a new one is
	// always later, also on a clock that stands still.
	lastEpoch int64
	calls     int // since the last sweep
}

// data is what a loss takes: everything but the listeners.
type data struct {
	epoch      int64 // µs; 0: none yet
	heard      int64 // ms: the last call with a TTL (0: none yet)
	graceFrom  int64 // ms: the start of the latest grace's silences (see silence)
	graceUntil int64 // ms: its end
	pauseUntil int64 // ms; a pause declared until then (0: none)
	keys       map[string]*key
	tombs      map[string]int64 // lease: abandoned until (ms)
	procs      map[string]int64 // process: alive until (ms)
	learned    map[string]learned
	budgets    map[string]map[int64][3]int64 // budget: step: counts per part (Budget)
}

type learned struct {
	state   string
	expires int64
}

// New returns an empty Store on the wall clock.
func New() *Store { return NewWithClock(time.Now) }

// NewWithClock returns an empty Store whose clock is now (a test's fake
// clock, say). Times in replies are now's, in milliseconds.
func NewWithClock(now func() time.Time) *Store {
	return &Store{clock: now, data: fresh(), subs: map[*sub]struct{}{}}
}

func fresh() data {
	return data{keys: map[string]*key{}, tombs: map[string]int64{}, procs: map[string]int64{}, learned: map[string]learned{},
		budgets: map[string]map[int64][3]int64{}}
}

var _ driver.Store = (*Store)(nil)

// errDown is what calls fail with while the store is killed.
var errDown = errors.New("memstore: down")

// enter waits while the store hangs, and locks it; it fails while the
// store is down or once ctx ends.
func (s *Store) enter(ctx context.Context) error {
	for {
		s.mu.Lock()
		hang, down := s.hang, s.down
		if hang == nil && down == nil {
			return nil
		}
		s.mu.Unlock()
		if down != nil {
			return down
		}
		select {
		case <-hang:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// The faults a test can make (see fleettest.Faults).

// Kill makes the store lose its data and fail every call until Restart;
// its listeners stop hearing until then.
func (s *Store) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data, s.down = fresh(), errDown
	if s.hang != nil { // a killed server hangs no more
		close(s.hang)
		s.hang = nil
	}
}

// Restart ends a Kill: the store answers again, empty; its listeners are
// told they listen anew.
func (s *Store) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = nil
	for x := range s.subs {
		x.send(event{kind: listening})
	}
}

// Stop makes calls wait until Cont (or their context ends), as a server
// that hangs.
func (s *Store) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hang == nil {
		s.hang = make(chan struct{})
	}
}

// Cont ends a Stop.
func (s *Store) Cont() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hang != nil {
		close(s.hang)
		s.hang = nil
	}
}

// Lose makes the running store lose its data, as a failover to an empty
// replica would.
func (s *Store) Lose() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data = fresh()
}

// Queued returns how many tickets wait in key's queue.
func (s *Store) Queued(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.data.keys[key]; k != nil {
		return len(k.queue)
	}
	return 0
}

// now returns the clock in milliseconds and microseconds.
func (s *Store) now() (ms, us int64) {
	t := s.clock()
	return t.UnixMilli(), t.UnixMicro()
}

const maxPause = 5 * 60 * 1000 // ms: no pause is honoured further than this (or a TTL) ahead

const keepGraces = 5 * 60 * 1000 // ms: graces that follow one another hold leases this long at most

// epochOf reads the epoch, making it if missing; declares the pause if
// the caller knew another epoch; and returns the epoch and the end of an
// honoured pause (0: none). See AdmitCall step 2.
func (s *Store) epochOf(now, us, known int64, pause, ttl time.Duration) (epoch, paused int64) {
	d := &s.data
	if d.epoch == 0 {
		d.epoch = max(us, s.lastEpoch+1)
		s.lastEpoch = d.epoch
	}
	born := d.epoch / 1000
	p, t := pause.Milliseconds(), driver.Millis(ttl)
	if known > 0 && known != d.epoch && p > 0 && d.pauseUntil <= now {
		if until := born + min(p, t); until > now {
			d.pauseUntil = until
		}
	}
	bound := max(t, maxPause)
	if d.pauseUntil <= now || d.pauseUntil > born+bound || d.pauseUntil > now+bound {
		return d.epoch, 0
	}
	return d.epoch, d.pauseUntil
}

// silence applies the rule of a call with ttl (driver.Store): if nothing
// was heard for more than ttl/2, no lease that had not expired at heard
// expires before now + ttl. Then heard is now. A lease a grace moved is
// marked (graced) until its holder extends it. A silence that began
// inside a grace (the holders it held may not have been heard since) is
// counted from the grace's start; once that is more than keepGraces ago,
// it moves only the leases not marked (until a silence that begins after
// a grace's end starts a count of its own): graces that
// follow one another (a fleet whose only calls are far apart, from
// processes that never live through a renewal round) hold a dead holder's
// lease that long at most, as the Redis store does, while holders that
// renewed are held by every silence (past the bound, for as long as the
// store keeps falling silent within a TTL of the last grace, only those
// that renewed between two silences). A silence of its own is honoured
// however long.
func (s *Store) silence(now int64, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	t, d := driver.Millis(ttl), &s.data
	if d.heard > 0 && now-d.heard > t/2 {
		marked := true // move the leases a grace moved too
		switch {
		case d.graceUntil <= d.heard: // a silence of its own
			d.graceFrom = d.heard
		case now-d.graceFrom <= keepGraces: // inside a grace, within the bound
			d.graceFrom = min(d.graceFrom, d.heard)
		default: // past it: until a silence of its own, only the leases renewed since
			marked = false
		}
		d.graceUntil = max(d.graceUntil, now+t)
		for _, k := range d.keys {
			for l, exp := range k.leases {
				if exp > d.heard && exp < now+t && (marked || !k.graced[l]) {
					k.leases[l] = now + t // a grant stays one
					k.graced[l] = true
					k.changed()
				}
			}
		}
	}
	d.heard = now
}

// declared reports whether a pause is declared now, honoured or not: a
// release serves no queue then.
func (s *Store) declared(now int64) bool { return s.data.pauseUntil > now }

// binds reports whether a limit below slots.Unlimited is among limits.
func binds(limits []int) bool {
	for _, n := range limits {
		if n < unlimited {
			return true
		}
	}
	return false
}

// unlimited is slots.Unlimited, which this package does not import.
const unlimited = int(^uint(0) >> 1)

func (s *Store) tombstoned(lease string, now int64) bool {
	until, ok := s.data.tombs[lease]
	if ok && until <= now {
		delete(s.data.tombs, lease)
		return false
	}
	return ok
}

func (s *Store) key(name string) *key {
	k := s.data.keys[name]
	if k == nil {
		k = &key{leases: map[string]int64{}, units: map[string]int{}, grants: map[string]bool{}, graced: map[string]bool{}, finish: map[flowKey]float64{}, flows: map[string]int{},
			queued: map[flowKey]int{}, base: map[flowKey]float64{}}
		s.data.keys[name] = k
	}
	return k
}

// alive renews proc's liveness for live milliseconds.
func (s *Store) alive(proc string, now, live int64) {
	s.data.procs[proc] = now + live
}

// dead reports whether proc is within 1.5 claim windows of its liveness
// deadline (or has none): its tickets are dropped, not granted.
func (s *Store) dead(proc string, now int64, claim int64) bool {
	until, ok := s.data.procs[proc]
	if ok && until <= now {
		delete(s.data.procs, proc)
	}
	return !ok || until <= now+claim*3/2
}

// Ping tells whether the store answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// Count returns the units of key's leases not expired now.
func (s *Store) Count(ctx context.Context, name string) (int, error) {
	if err := s.enter(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	now, _ := s.now()
	k := s.data.keys[name]
	if k == nil {
		return 0, nil
	}
	return k.count(now), nil
}

// Leave takes proc out of the liveness the store keeps.
func (s *Store) Leave(ctx context.Context, proc string) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	delete(s.data.procs, proc)
	return nil
}

// versionRE finds a learned state's version: the digits of its first "v".
var versionRE = regexp.MustCompile(`"v":([0-9]+)[,}]`)

// SyncLearned reads key's learned state and, with a State, writes it if
// the store has the version presumed, and publishes it.
func (s *Store) SyncLearned(ctx context.Context, c *driver.LearnedCall) (driver.LearnedResult, error) {
	if err := s.enter(ctx); err != nil {
		return driver.LearnedResult{}, err
	}
	defer s.mu.Unlock()
	now, _ := s.now()
	st, ok := s.data.learned[c.Key]
	if ok && st.expires <= now {
		delete(s.data.learned, c.Key)
		ok = false
	}
	v := "-"
	if ok {
		v = "?"
		if m := versionRE.FindStringSubmatch(st.state); m != nil {
			v = m[1]
		}
	}
	ttl := driver.Millis(c.TTL)
	if c.State != "" && v == c.Presumed {
		s.data.learned[c.Key] = learned{c.State, now + ttl}
		s.publish("", event{kind: learnedState, payload: c.State})
		return driver.LearnedResult{Wrote: true}, nil
	}
	if !ok {
		return driver.LearnedResult{Version: v}, nil
	}
	if st.expires-now < ttl/2 {
		st.expires = now + ttl
		s.data.learned[c.Key] = st
	}
	return driver.LearnedResult{Version: v, State: st.state, Found: true}, nil
}

// sweepEvery is how many calls go between two sweeps of what nothing else
// deletes.
const sweepEvery = 1024

// swept forgets, once every sweepEvery calls, what has passed: abandoned
// leases' marks, processes long gone, learned states expired, and keys
// with nothing held or queued. Call it with s.mu held.
func (s *Store) swept(now int64) {
	if s.calls++; s.calls < sweepEvery {
		return
	}
	s.calls = 0
	d := &s.data
	for l, until := range d.tombs {
		if until <= now {
			delete(d.tombs, l)
		}
	}
	for p, until := range d.procs {
		if until <= now {
			delete(d.procs, p)
		}
	}
	for k, st := range d.learned {
		if st.expires <= now {
			delete(d.learned, k)
		}
	}
	for name, k := range d.keys {
		k.dropExpired(now)
		s.tidy(name)
	}
	for name, steps := range d.budgets {
		latest := int64(-1 << 62)
		for st := range steps {
			latest = max(latest, st)
		}
		if latest < now/1000-driver.BudgetSteps {
			delete(d.budgets, name)
		}
	}
}
