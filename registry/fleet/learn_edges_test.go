package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/learn"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// The edges of a learned cap: panics in what it calls, syncs that race
// with evidence, settings and messages, and states it cannot trust.

// stateHook runs fn once, when armed, around a call of the learn write
// script on a learned state (with its Redis key): before it if before, else after it.
type stateHook struct {
	armed  atomic.Bool
	before bool
	fn     func(key string)
}

func (h *stateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		// The call of a sync on a state: the learn write script's (EVALSHA,
		// or EVAL after NOSCRIPT), whose first key is the state's.
		name, key := cmd.Name(), ""
		if (name == "evalsha" || name == "eval") && len(a) > 3 {
			key = fmt.Sprint(a[3])
		}
		hit := strings.Contains(key, "#learn:")
		if hit && h.before && h.armed.CompareAndSwap(true, false) {
			h.fn(key)
		}
		err := next(ctx, cmd)
		if hit && !h.before && h.armed.CompareAndSwap(true, false) {
			h.fn(key)
		}
		return err
	}
}
func (h *stateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// learnPQ opens a Registry named name on c, learning keys "p" and "q" with
// the default settings, both read from Redis.
func learnPQ(t *testing.T, c *redis.Client, name string) *Registry[string] {
	t.Helper()
	r := New[string](redisstore.New(c, name), 100, WithLogger(quiet()))
	for _, k := range []string{"p", "q"} {
		require.NoError(t, r.Learn(k, upstream.AdaptiveConfig{}))
		settled(t, r, k)
	}
	return r
}

// lockFree reports whether the learned caps' learnMu, r.mu and the learned
// caps' mu can be taken, in that order, within a second.
func lockFree(r *Registry[string]) bool {
	done := make(chan struct{})
	go func() {
		r.learned.learnMu.Lock()
		defer r.learned.learnMu.Unlock()
		r.mu.Lock()
		defer r.mu.Unlock() // taken: that is all this asks
		r.learned.mu.Lock()
		defer r.learned.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(time.Second):
		return false
	}
}

// learnOf returns a copy of key's learning in r, under its lock.
func learnOf(r *Registry[string], key string) learning {
	r.learned.mu.Lock()
	defer r.learned.mu.Unlock()
	return *r.learned.learning[key]
}

// settled waits until key's state in r has been read, and no sync is under
// way.
func settled(t *testing.T, r *Registry[string], key string) {
	t.Helper()
	fwUntil(t, "the learned state read", func() bool { lk := learnOf(r, key); return !lk.syncing && !lk.stale && lk.known })
}

// A log handler that panics on a learned cap's change leaves the Registry
// working: changes are logged after the lock.
func TestLearnedCapLogHandlerPanics(t *testing.T) {
	srv := redistest.Start(t)
	var fired atomic.Bool
	r := New[string](redisstore.New(srv.Client(), "le-log"), 100, WithLogger(slog.New(testrig.PanicHandler{Match: "learned cap", Fired: &fired})))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
	s, err := r.TryAcquire("p")
	require.NoError(t, err)
	r.Report(s, upstream.Verdict{Kind: upstream.Concurrency})
	require.True(t, fired.Load())
	require.True(t, lockFree(r), "a lock left locked by a panicking log handler")
	s.Release()
}

// calledFrom reports whether the calling goroutine's stack runs through
// fn (a method's name, as ".syncedLocked(").
func calledFrom(fn ...string) bool {
	buf := make([]byte, 16<<10)
	stack := string(buf[:runtime.Stack(buf, false)])
	for _, f := range fn {
		if strings.Contains(stack, f) {
			return true
		}
	}
	return false
}

// A LimitFunc that panics at the end of a sync the store answered still
// ends the sync, with what it wrote no longer pending: the learner syncs
// the key again, and a cut's Report writes it before it returns.
func TestLearnedCapLimitFuncPanicEndsTheSync(t *testing.T) {
	srv := redistest.Start(t)
	var armed, fired atomic.Bool
	r := NewWithKeys(redisstore.New(srv.Client(), "le-synced"), 100, Keys[string]{Limit: func(string) int {
		if armed.Load() && calledFrom(".syncedLocked(") && armed.CompareAndSwap(true, false) {
			fired.Store(true)
			panic("limit func panics at the end of a sync")
		}
		return 50
	}}, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30}))
	settled(t, r, "p")
	armed.Store(true)
	r.learnedStale() // a read, which the store answers
	fwUntil(t, "Keys.Limit panics at the end of a sync", fired.Load)
	require.True(t, lockFree(r), "a lock left locked by the panic")
	settled(t, r, "p") // synced again, by the learner

	held := holdP(t, 30, r)
	r.Report(held[29], upstream.Verdict{Kind: upstream.Concurrency})
	assert.Empty(t, learnOf(r, "p").pending, "the cut is written when Report returns")
	assert.Equal(t, 29, r.Learned("p").Cap)
	for _, s := range held {
		s.Release()
	}
}

// Once a key is learned, the LimitFunc is still asked only where a limit
// is needed: not by ClearLimit, Learned or an admission's learned limits
// for a key that is not learned (a LimitFunc that fails for keys it does
// not know would break them).
func TestLimitFuncNotAskedForKeysNotLearned(t *testing.T) {
	srv := redistest.Start(t)
	var asked atomic.Int64
	r := NewWithKeys(redisstore.New(srv.Client(), "le-unlearned"), 100, Keys[string]{Limit: func(k string) int {
		if k == "x" && calledFrom(".reconfigureLocked(", ".learnedFor(", ".Learned(", ".syncedLocked(", ".takeMessage(") {
			asked.Add(1)
		}
		return 50
	}}, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30}))
	settled(t, r, "p")
	r.SetLimit("x", 5)
	r.ClearLimit("x")
	assert.False(t, r.Learned("x").Enabled)
	s, err := r.TryAcquireAll("p", "x") // its learned limits applied, key by key
	require.NoError(t, err)
	s.Release()
	assert.Zero(t, asked.Load(), "Keys.Limit asked for a key that is not learned")
}

// A LimitFunc that panics in the learner's round leaves the locks free.
func TestLearnedCapLimitFuncPanics(t *testing.T) {
	srv := redistest.Start(t)
	var armed, fired atomic.Bool
	r := NewWithKeys(redisstore.New(srv.Client(), "le-limitfunc"), 100, Keys[string]{Limit: func(string) int {
		if armed.CompareAndSwap(true, false) {
			fired.Store(true)
			panic("limit func panics")
		}
		return 50
	}}, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{}))
	settled(t, r, "p")
	armed.Store(true)
	fwUntil(t, "the learner calls Keys.Limit", fired.Load)
	require.True(t, lockFree(r), "a lock left locked by a Keys.Limit panic in the learner")
	settled(t, r, "p") // and it goes on
}

// A panic in one key's sync (a client hook) does not strand the other
// keys of the round: each is read again.
func TestLearnedCapSyncPanics(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	h := &stateHook{before: true, fn: func(string) { panic("hook panics") }}
	c.AddHook(h)
	r := learnPQ(t, c, "le-strand")
	defer r.Close()
	before := learnOf(r, "q").readAt
	h.armed.Store(true)
	r.learnedStale() // one round with both keys due
	fwUntil(t, "the hook panics", func() bool { return !h.armed.Load() })
	for _, k := range []string{"p", "q"} {
		fwUntil(t, k+" read again", func() bool { lk := learnOf(r, k); return !lk.syncing && lk.readAt.After(before) })
	}
}

// Evidence queued while a sync is under way, more than the bound, is not
// lost to the bookkeeping of what the sync wrote.
func TestLearnedCapEvidenceDuringASync(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	var r *Registry[string]
	h := &stateHook{}
	h.fn = func(string) {
		r.learned.mu.Lock()
		defer r.learned.mu.Unlock()
		lk := r.learned.learning["p"]
		for i := range 300 {
			at := time.Now().Add(time.Hour)
			r.learned.noteLocked(lk, learnEvent{kind: evStarted, n: lk.cap.Lo + 1, id: uint64(at.UnixMicro()) + uint64(i), now: at.UnixNano() + int64(i)})
		}
	}
	c.AddHook(h)
	r = New[string](redisstore.New(c, "le-pending"), 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{}))
	settled(t, r, "p")
	h.armed.Store(true)
	r.learnedStale()
	fwUntil(t, "the evidence queued during the sync", func() bool { return !h.armed.Load() })
	fwUntil(t, "written", func() bool { lk := learnOf(r, "p"); return !lk.syncing && len(lk.pending) == 0 })
	assert.NotZero(t, learnOf(r, "p").cap.ProbeN, "the probe queued during the sync")
}

// A Learn with new settings while a sync is under way holds once the
// sync ends.
func TestLearnDuringASync(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	var r *Registry[string]
	h := &stateHook{}
	h.fn = func(string) { _ = r.Learn("p", upstream.AdaptiveConfig{Max: 8}) }
	c.AddHook(h)
	r = New[string](redisstore.New(c, "le-relearn"), 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Max: 64, Initial: 30}))
	settled(t, r, "p")
	h.armed.Store(true)
	r.learnedStale()
	fwUntil(t, "Learn during the sync", func() bool { return !h.armed.Load() })
	fwUntil(t, "the sync ends", func() bool { return !learnOf(r, "p").syncing })
	l := r.Learned("p")
	assert.Equal(t, 8, l.Max, "Learn's new Max")
	assert.LessOrEqual(t, l.Limit, 8)
}

// Another process's cut, published while this process reads the state,
// is taken from its message at once, not at the next read.
func TestLearnedCapMessageDuringASync(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	other := srv.Client()
	var r *Registry[string]
	h := &stateHook{}
	h.fn = func(string) {
		lk := learnOf(r, "p")
		st := storedCap{Key: "p", V: lk.stored.V + 5, E: r.epoch.Load(), Cap: lk.cap}
		st.Cap.Lo, st.Cap.Hi, st.Cap.HiAt = 2, 2, time.Now().UnixNano()
		b, err := json.Marshal(st)
		if err == nil {
			err = other.Set(context.Background(), learnKey(r, lk.name), b, time.Hour).Err()
		}
		if err == nil {
			err = other.Publish(context.Background(), learnChannel(r), b).Err()
		}
		if err != nil {
			panic(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for learnOf(r, "p").stored.V != st.V { // the message taken, before this sync ends
			if time.Now().After(deadline) {
				panic("the message was not taken")
			}
			time.Sleep(time.Millisecond) // polling a condition
		}
	}
	c.AddHook(h)
	r = New[string](redisstore.New(c, "le-stale"), 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30}))
	s, err := r.TryAcquire("q") // a reply tells r the epoch, which messages carry
	require.NoError(t, err)
	s.Release()
	settled(t, r, "p")
	h.armed.Store(true)
	r.learnedStale()
	fwUntil(t, "the other process's write", func() bool { return !h.armed.Load() })
	fwUntil(t, "the sync ends", func() bool { return !learnOf(r, "p").syncing })
	assert.Equal(t, 2, r.Learned("p").Cap, "the cut another process published")
}

// A refusal counts against the last learned key of an admission, however
// many keys it has.
func TestLearnedCapRefusalGoesToTheLastKey(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "le-path"), 100)
	defer r.Close()
	keys := []string{"a", "b", "c", "d", "e", "f"}
	for _, k := range keys[:5] {
		require.NoError(t, r.Learn(k, upstream.AdaptiveConfig{Initial: 10}))
	}
	s, err := r.TryAcquireAll(keys...)
	require.NoError(t, err)
	r.Report(s, upstream.Verdict{Kind: upstream.Concurrency})
	s.Release()
	assert.Equal(t, 10, r.Learned("d").Cap, "d is not the last learned key")
	assert.Less(t, r.Learned("e").Cap, 10, "e, the last learned key, takes the refusal")
}

// After Forget the local registry follows the LimitFunc again.
func TestForgetReturnsTheLocalLimit(t *testing.T) {
	srv := redistest.Start(t)
	var lim atomic.Int64
	lim.Store(10)
	r := NewWithKeys(redisstore.New(srv.Client(), "le-forget"), 100, Keys[string]{Limit: func(string) int { return int(lim.Load()) }})
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 4}))
	require.Equal(t, 5, r.Local().Limit("p"), "the learned limit: 4, and a probe")
	r.Forget("p")
	lim.Store(3)
	// The local registry asks the LimitFunc at an admission, at most once
	// a LocalLimitRefresh.
	admits := func() int {
		var held []*slots.Slot
		for {
			s, err := r.Local().TryAcquire("p")
			if err != nil {
				break
			}
			held = append(held, s)
		}
		for _, s := range held {
			s.Release()
		}
		return len(held)
	}
	fwUntil(t, "the local registry follows the LimitFunc again", func() bool { return admits() == 3 })
}

// A state that is read but not changed (a cap at its ceiling, a fleet
// that needs less) does not expire while it is in use.
func TestLearnedStateKeptWhileRead(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	r := New[string](redisstore.New(c, "le-ttl"), 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 10, Max: 64}))
	settled(t, r, "p")
	key := learnKey(r, "p")
	require.NoError(t, c.PExpire(context.Background(), key, 3*time.Second).Err()) // as if the day had nearly passed
	fwUntil(t, "a read gives it a day again", func() bool { return c.PTTL(context.Background(), key).Val() > time.Hour })
}

// startCeiling is over the number of every start admitted before it is
// read, by any process, while the server's clock runs with the local one.
// A start is numbered by the server's wall clock, the ceiling reads the
// local monotonic one: a step of the wall clock (as a VM's time sync
// makes, here on the same machine) puts starts over the ceiling until the
// next reply tells the clock anew. Such a start is excused only by a step
// at least as large, measured here between the wall and monotonic clocks
// since rs[0]'s clock was last told.
func TestStartCeiling(t *testing.T) {
	srv := redistest.Start(t)
	rs := fwFleet(t, srv, "le-ceiling", 2, 1000)
	require.NoError(t, rs[1].Learn("k", upstream.AdaptiveConfig{Initial: 1000})) // starts of a learned key are numbered
	base := time.Now()
	wallAhead := func() int64 { // the wall clock's lead on the monotonic one since base, µs
		now := time.Now()
		return (now.UnixNano() - base.UnixNano() - now.Sub(base).Nanoseconds()) / 1000
	}
	told := wallAhead() // before rs[0]'s clock is told
	s, err := rs[0].TryAcquire("warm")
	require.NoError(t, err)
	s.Release()
	bad, excused := 0, 0
	for i := range 1000 {
		s, err := rs[1].TryAcquire("k")
		require.NoError(t, err)
		id := (*core.Handle)(s).Hold().Owner.(*lease[string]).start.id
		require.NotZero(t, id)
		if ceil := rs[0].clock.startCeiling(); id > ceil {
			over, step := int64(id-ceil), wallAhead()-told
			if over <= step {
				excused++
				t.Logf("start %d µs over the ceiling after the wall clock stepped %d µs", over, step)
			} else {
				bad++
				t.Logf("start %d µs over the ceiling; the wall clock stepped %d µs", over, step)
			}
		}
		s.Release()
		if i%7 == 0 { // rs[0]'s clock told anew now and then
			told = wallAhead()
			if s, err := rs[0].TryAcquire("warm"); err == nil {
				s.Release()
			}
		}
	}
	assert.Zero(t, bad, "starts numbered over a ceiling read after them, the clocks running together")
	t.Logf("%d of 1000 starts over the ceiling after a step of the wall clock", excused)
}

// A state in Redis that is not a Cap ("null", a zero value, another
// key's) is written over, as a missing one.
func TestLearnedStateNotACap(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	r := New[string](redisstore.New(c, "le-foreign"), 100)
	defer r.Close()
	for _, v := range []string{"null", `{"k":"p","v":3,"cap":{}}`, `{"k":"q","v":3,"cap":{"lo":2,"hi":2,"step":1,"gap":1}}`} {
		require.NoError(t, c.Set(context.Background(), learnKey(r, "p"), v, time.Hour).Err())
		r.Forget("p")
		require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 4}))
		settled(t, r, "p")
		lk := learnOf(r, "p")
		assert.True(t, lk.cap.Valid(), v)
		assert.Equal(t, 4, lk.cap.Lo, "the initial cap, as for a missing state: %s", v)
		assert.Contains(t, c.Get(context.Background(), learnKey(r, "p")).Val(), `"k":"p"`, "written over: %s", v)
	}
}

// On a Redis Cluster, the state's transaction and its channel work.
func TestLearnedCapOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	a := New[string](redisstore.New(cl.Client(), "le-cluster"), 100)
	defer a.Close()
	b := New[string](redisstore.New(cl.Client(), "le-cluster"), 100)
	defer b.Close()
	require.NoError(t, a.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
	require.NoError(t, b.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
	held := holdP(t, 5, a)
	a.Report(held[4], upstream.Verdict{Kind: upstream.Concurrency})
	fwUntil(t, "the other process learns the cut", func() bool { return b.Learned("p").Cap == 4 })
	for _, s := range held {
		s.Release()
	}
}

// recordHandler counts the log records whose message holds match.
type recordHandler struct {
	match string
	n     *atomic.Int64
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, h.match) {
		h.n.Add(1)
	}
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

// A Redis that refuses the learned state's write (here an ACL that lets
// the process at every key of its name but the learned states) is logged,
// and does not open the breaker: admissions go on in Redis.
func TestLearnedCapWriteRefused(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	require.NoError(t, admin.Do(context.Background(), "ACL", "SETUSER", "nolearn", "on", ">pw", "&*", "+@all",
		"~inflight:{le-acl}:*", "~inflight:{le-acl}#epoch", "~inflight:{le-acl}#pause", "~inflight:{le-acl}#procs", "~inflight:{le-acl}#heard").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nolearn", Password: "pw"})
	defer c.Close()
	var logged atomic.Int64
	r := New[string](redisstore.New(c, "le-acl"), 100, WithLogger(slog.New(recordHandler{match: "learned cap not written", n: &logged})))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{}))
	fwUntil(t, "the refusal logged", func() bool { return logged.Load() > 0 })
	for range 20 {
		s, err := r.TryAcquire("q")
		require.NoError(t, err)
		assert.False(t, s.Degraded(), "admitted in Redis")
		s.Release()
	}
	assert.False(t, r.Stats().BreakerOpen)
	assert.Zero(t, r.Stats().StoreErrors)
}

// A start numbered before a cut, whose evidence reaches the state after
// the cut (a cut is written at once, a start in the background), is
// neither a probe nor the cut's test: it cannot undo the cut.
func TestLearnedCapStartBeforeACut(t *testing.T) {
	c := *learn.Settings{Initial: 4, Max: 64}.New(0)
	at := int64(1_000_000_000_000)
	learnEvent{step: learn.Cut, n: 4, id: 100, at: at, now: at + int64(5*time.Millisecond), seq: 300}.apply(&c)
	require.Equal(t, 3, c.Lo)
	require.Equal(t, 3, c.Hi)
	learnEvent{kind: evStarted, n: 5, id: 200, at: at + 1000, now: at + 1000}.apply(&c) // numbered before the cut
	learnEvent{kind: evTick, now: at + int64(time.Second)}.apply(&c)
	assert.Equal(t, 3, c.Lo, "the cut stands")
	assert.Equal(t, 3, c.Hi, "and the ceiling it found")
}

// The same across two processes: A's probe starts before B's cut, and its
// start is written after it.
func TestLearnedCapStartBeforeACutFleet(t *testing.T) {
	srv := redistest.Start(t)
	ca := srv.Client()
	cutDone := make(chan struct{})
	h := &stateHook{before: true, fn: func(string) { <-cutDone }}
	ca.AddHook(h)
	a := New[string](redisstore.New(ca, "le-stale-start"), 100, WithLogger(quiet()))
	defer a.Close()
	b := New[string](redisstore.New(srv.Client(), "le-stale-start"), 100, WithLogger(quiet()))
	defer b.Close()
	cfg := upstream.AdaptiveConfig{Initial: 4, Max: 64}
	require.NoError(t, a.Learn("p", cfg))
	require.NoError(t, b.Learn("p", cfg))
	settled(t, a, "p")
	settled(t, b, "p")
	held := holdP(t, 4, b)
	h.armed.Store(true)         // A's next write of p waits for B's cut
	s, err := a.TryAcquire("p") // count 5: a probe
	require.NoError(t, err)
	b.Report(held[3], upstream.Verdict{Kind: upstream.Concurrency}) // count 4: a cut, written now
	require.Equal(t, 3, b.Learned("p").Cap)
	close(cutDone)
	for _, r := range []*Registry[string]{a, b} {
		fwUntil(t, "no probe out, nothing to write", func() bool {
			lk := learnOf(r, "p")
			return lk.cap.ProbeN == 0 && len(lk.pending) == 0 && !lk.syncing && lk.stored.V == learnOf(b, "p").stored.V
		})
		l := r.Learned("p")
		assert.Equal(t, 3, l.Cap, "the cut stands")
		assert.Equal(t, 3, l.Ceiling, "and its ceiling")
	}
	s.Release()
	for _, s := range held {
		s.Release()
	}
}

// A ClearLimit whose LimitFunc panics leaves nothing locked.
func TestLearnedCapClearLimitPanics(t *testing.T) {
	srv := redistest.Start(t)
	var armed atomic.Bool
	r := NewWithKeys(redisstore.New(srv.Client(), "le-clear"), 100, Keys[string]{Limit: func(string) int {
		if armed.Load() {
			panic("limit func panics")
		}
		return 50
	}}, WithLogger(quiet()))
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{}))
	armed.Store(true)
	func() {
		defer func() { _ = recover() }()
		r.ClearLimit("p")
	}()
	armed.Store(false)
	done := make(chan struct{})
	go func() { r.SetLimit("p", 7); close(done) }()
	select {
	case <-done:
		r.Close() // not before: with a lock left held, Close would hang
	case <-time.After(2 * time.Second):
		t.Fatal("SetLimit blocked: a lock left held by the LimitFunc's panic")
	}
}

// A LimitFunc that panics as a learned state's message is taken does not
// end the process (the test runs in a child process).
func TestLearnedCapMessageLimitFuncPanics(t *testing.T) {
	if os.Getenv("FLEET_LEARN_CHILD") == "1" {
		srv := redistest.Start(t)
		var armed, panicked atomic.Bool
		a := New[string](redisstore.New(srv.Client(), "le-sub"), 100, WithLogger(quiet()))
		defer a.Close()
		b := NewWithKeys(redisstore.New(srv.Client(), "le-sub"), 100, Keys[string]{Limit: func(string) int {
			if armed.Load() {
				panicked.Store(true)
				panic("limit func panics")
			}
			return 100
		}}, WithLogger(quiet()))
		defer b.Close()
		cfg := upstream.AdaptiveConfig{Initial: 4}
		require.NoError(t, a.Learn("p", cfg))
		require.NoError(t, b.Learn("p", cfg))
		settled(t, a, "p")
		settled(t, b, "p")
		s, err := a.TryAcquire("p")
		require.NoError(t, err)
		armed.Store(true)
		a.Report(s, upstream.Verdict{Kind: upstream.Concurrency}) // published: b takes it
		s.Release()
		fwUntil(t, "b takes the message", panicked.Load)
		armed.Store(false)
		fwUntil(t, "b learns the cut", func() bool { return b.Learned("p").Cap < 4 })
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLearnedCapMessageLimitFuncPanics$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FLEET_LEARN_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		i := max(strings.Index(string(out), "panic:"), 0)
		t.Fatalf("the child process failed: %v\n%s", err, string(out)[i:min(i+1500, len(out))])
	}
}

// A key forgotten while its sync waits its turn in a round still ends
// that sync: a Report waiting for it is not left to its timeout.
func TestLearnedCapForgottenInARound(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	inRound, proceed := make(chan string, 1), make(chan struct{})
	h := &stateHook{before: true, fn: func(key string) { inRound <- key; <-proceed }}
	c.AddHook(h)
	r := learnPQ(t, c, "le-forget-round")
	defer r.Close()
	h.armed.Store(true)
	r.learnedStale() // one round, both due and marked syncing
	first := <-inRound
	other := "q"
	if strings.HasSuffix(first, ":q") {
		other = "p"
	}
	r.learned.mu.Lock()
	lk := r.learned.learning[other]
	require.True(t, lk.syncing)
	synced := lk.synced
	r.learned.mu.Unlock()
	r.Forget(other)
	close(proceed)
	select {
	case <-synced:
	case <-time.After(2 * time.Second):
		t.Fatal("the forgotten key's sync never ended")
	}
}

// After Redis lost its data, a state written anew by a process that knew
// none comes after the states before it: a process that knew one takes
// the next cut from its message, not at its next read.
func TestLearnedCapVersionsAfterDataLoss(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	a := New[string](redisstore.New(srv.Client(), "le-loss-version"), 100, WithLogger(quiet()))
	defer a.Close()
	cfg := upstream.AdaptiveConfig{Initial: 10, Max: 64}
	require.NoError(t, a.Learn("p", cfg))
	settled(t, a, "p")
	held := holdP(t, 10, a)
	a.Report(held[9], upstream.Verdict{Kind: upstream.Concurrency})
	a.Report(held[0], upstream.Verdict{Kind: upstream.Concurrency})
	for _, s := range held {
		s.Release()
	}
	settled(t, a, "p")
	at := learnOf(a, "p").readAt
	fwUntil(t, "a reads", func() bool { return learnOf(a, "p").readAt.After(at) }) // its next read is a second away
	require.NoError(t, admin.FlushAll(context.Background()).Err())
	c := New[string](redisstore.New(srv.Client(), "le-loss-version"), 100, WithLogger(quiet()))
	defer c.Close()
	require.NoError(t, c.Learn("p", cfg))
	settled(t, c, "p")
	s, err := c.TryAcquire("p")
	require.NoError(t, err)
	c.Report(s, upstream.Verdict{Kind: upstream.Concurrency})
	s.Release()
	cut := c.Learned("p").Cap
	within(t, 300*time.Millisecond, "a takes c's cut from its message", func() bool { return a.Learned("p").Cap == cut })
}

// Forget and SetLimit racing leave the local registry at the fleet's limit.
func TestForgetRacesSetLimit(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "le-forget-set"), 100, WithLogger(quiet()))
	defer r.Close()
	bad := 0
	for i := range 10000 {
		require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{}))
		n := 10 + i%50
		done := make(chan struct{})
		go func() { r.SetLimit("p", n); close(done) }()
		r.Forget("p")
		<-done
		if r.Local().Limit("p") != r.Limit("p") {
			bad++
		}
	}
	assert.Zero(t, bad, "the local limit other than the fleet's")
}

// Channels are not per database: two fleets of one name in two databases
// of one server do not take each other's learned states.
func TestLearnedCapTwoDatabases(t *testing.T) {
	srv := redistest.Start(t)
	c1 := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 1})
	defer c1.Close()
	c2 := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 2})
	defer c2.Close()
	a := New[string](redisstore.New(c1, "le-dbs"), 100, WithLogger(quiet()))
	defer a.Close()
	b := New[string](redisstore.New(c2, "le-dbs"), 100, WithLogger(quiet()))
	defer b.Close()
	cfg := upstream.AdaptiveConfig{Initial: 10, Max: 64}
	require.NoError(t, a.Learn("p", cfg))
	require.NoError(t, b.Learn("p", cfg))
	held := holdP(t, 10, a)
	s, err := b.TryAcquire("p") // b's epoch known
	require.NoError(t, err)
	s.Release()
	settled(t, b, "p")
	readAt, changes := learnOf(b, "p").readAt, b.Learned("p").Changes
	a.Report(held[9], upstream.Verdict{Kind: upstream.Concurrency}) // a's cut, published
	require.Equal(t, 9, a.Learned("p").Cap)
	for _, s := range held {
		s.Release()
	}
	fwUntil(t, "b reads its own database again", func() bool { lk := learnOf(b, "p"); return !lk.syncing && lk.readAt.After(readAt) })
	assert.Equal(t, 10, b.Learned("p").Cap, "a's cut is not b's")
	assert.Equal(t, changes, b.Learned("p").Changes, "not even for a moment")
}

// Learn and Forget racing leave the local registry at the fleet's limit.
func TestLearnRacesForget(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "le-learn-forget"), 100, WithLogger(quiet()))
	defer r.Close()
	cfg := upstream.AdaptiveConfig{Initial: 4}
	bad := 0
	for range 20000 {
		require.NoError(t, r.Learn("p", cfg))
		done := make(chan struct{})
		go func() { _ = r.Learn("p", cfg); close(done) }()
		r.Forget("p")
		<-done
		if r.Learned("p").Enabled && r.Local().Limit("p") != r.Limit("p") {
			bad++
		}
		r.Forget("p")
	}
	assert.Zero(t, bad, "learned, with the local limit other than the fleet's")
}

// slowAcquire delays the next acquire call before it is sent, once armed.
type slowAcquire struct {
	armed atomic.Bool
	d     time.Duration
}

func (h *slowAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isAcquire(cmd) && h.armed.CompareAndSwap(true, false) {
			time.Sleep(h.d) // a slow call: its reply bounds the server's clock loosely
		}
		return next(ctx, cmd)
	}
}
func (h *slowAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A cut's number is not far ahead of the server's clock when the latest
// reply came back slowly: the first start after the cut is its test.
func TestLearnedCapCutAfterASlowReply(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	h := &slowAcquire{d: 150 * time.Millisecond}
	c.AddHook(h)
	r := New[string](redisstore.New(c, "le-cutseq"), 100, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 4, Max: 64}))
	settled(t, r, "p")
	var held []*slots.Slot
	for i := range 4 {
		h.armed.Store(i == 3)
		s, err := r.TryAcquire("p")
		require.NoError(t, err)
		held = append(held, s)
	}
	r.Report(held[3], upstream.Verdict{Kind: upstream.Concurrency})
	cut := int64(learnOf(r, "p").cap.CutSeq) * 1000
	ahead := time.Duration(cut - r.clock.nanos())
	assert.Less(t, ahead, 10*time.Millisecond, "the cut's number is a few milliseconds ahead at most, not a slow reply's 150")
	for _, s := range held[1:] {
		s.Release()
	}
	fwUntil(t, "the releases reach Redis", func() bool { n, err := r.InFlight(context.Background(), "p"); return err == nil && n == 1 })
	fwUntil(t, "the server's clock passes the cut's number", func() bool { return r.clock.nanos() > cut+int64(2*time.Millisecond) })
	s, err := r.TryAcquire("p")
	require.NoError(t, err)
	assert.NotZero(t, learnOf(r, "p").cap.ProbeN, "the first start after the cut is its test (the cut's number was %v ahead)", ahead)
	s.Release()
	held[0].Release()
}

// A state that already holds some evidence (this process's own write, come
// back as a message before the write's reply has trimmed it from pending)
// gets that evidence applied again on top: a batch's refusals applied twice
// must not lower its ceiling twice.
func TestLearnedCapEvidenceAppliedTwice(t *testing.T) {
	sec := int64(time.Second)
	c := learn.New(1, 64, 16, 10*time.Second)
	c.Step = 4 // as a climb leaves it: the next batch is four wide
	lk := &learning{base: *c}
	for i, n := 0, 17; n <= 20; i, n = i+1, n+1 {
		lk.pending = append(lk.pending, learnEvent{kind: evStarted, n: n, id: uint64(100 + i), at: sec, now: sec})
	}
	lk.pending = append(lk.pending,
		learnEvent{step: learn.Cut, n: 20, id: 103, seq: 103, at: sec, now: sec + 5e7},
		learnEvent{step: learn.Cut, n: 19, id: 102, seq: 103, at: sec, now: sec + 5e7})
	lk.rebaseLocked()
	written := lk.cap
	require.Equal(t, 18, written.Hi, "refusals at 20 and 19 of a batch up to 20: %+v", written)
	lk.base = written
	lk.rebaseLocked()
	assert.Equal(t, written.Hi, lk.cap.Hi, "the same refusals applied again: %+v", lk.cap)
	assert.Equal(t, written.Lo, lk.cap.Lo)
}

// The same for a retest of a known ceiling, admitted or taken as admitted
// unanswered: its count reopens the ceiling but leaves the cap at it, and
// applied again it does not prove the count a second time. A refusal of
// the retest that came after it was taken as admitted sets the ceiling
// back, once.
func TestLearnedCapRetestAppliedTwice(t *testing.T) {
	sec := int64(time.Second)
	for _, tc := range []struct {
		name    string
		answers []learnEvent
		hi      int // the ceiling after them
	}{
		{"admitted", []learnEvent{{step: learn.Proved, n: 21, id: 100, seq: 101}}, 64},
		{"unanswered", []learnEvent{{kind: evTick, now: 12 * sec, seq: 101}}, 64},
		{"unanswered, then refused", []learnEvent{{kind: evTick, now: 12 * sec, seq: 101},
			{step: learn.Cut, n: 21, id: 100, seq: 101, at: 11 * sec, now: 12*sec + 1e7}}, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := learn.New(1, 64, 20, 10*time.Second)
			c.Hi, c.HiAt = 20, sec // a ceiling of 20, found a second in
			lk := &learning{base: *c}
			now := 11 * sec // the retest is due
			require.Equal(t, 21, lk.base.Limit(now), "the retest's limit")
			lk.pending = append([]learnEvent{{kind: evStarted, n: 21, id: 100, at: now, now: now}}, tc.answers...)
			lk.rebaseLocked()
			written := lk.cap
			require.Equal(t, 20, written.Lo, "the cap stays at the old ceiling: %+v", written)
			require.Equal(t, tc.hi, written.Hi, "the ceiling: %+v", written)
			lk.base = written
			lk.rebaseLocked()
			// (A refusal's time is taken twice, as before: the gap moves
			// a little.)
			again := lk.cap
			again.Refusal, again.RefusalDev = written.Refusal, written.RefusalDev
			assert.Equal(t, written, again, "the same evidence applied again")
			if tc.hi == 64 {
				assert.Equal(t, 21, lk.cap.Limit(now+sec), "the next probe goes at the retest's count")
			}
		})
	}
}

// A stored state whose version a Lua number cannot hold exactly (over
// 2^53, over 2^63, not a whole number) is still written over by the next
// write: the write script compares versions as digits.
func TestLearnedCapOddVersionIsWrittenOver(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	for i, v := range []string{"9007199254740993", "18446744073709551615", "1.5"} {
		t.Run(v, func(t *testing.T) {
			r := New[string](redisstore.New(srv.Client(), fmt.Sprintf("le-odd-%d", i)), 100, WithLogger(quiet()))
			defer r.Close()
			require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30, Max: 64}))
			settled(t, r, "p")
			lk := learnOf(r, "p")
			raw, err := admin.Get(context.Background(), learnKey(r, lk.name)).Result()
			require.NoError(t, err)
			var m map[string]json.RawMessage
			require.NoError(t, json.Unmarshal([]byte(raw), &m))
			m["v"] = json.RawMessage(v)
			odd, err := json.Marshal(m)
			require.NoError(t, err)
			require.NoError(t, admin.Set(context.Background(), learnKey(r, lk.name), odd, time.Hour).Err())

			held := holdP(t, 30, r)
			r.Report(held[29], upstream.Verdict{Kind: upstream.Concurrency}) // a cut, written before Report returns
			for _, s := range held {
				s.Release()
			}
			fwUntil(t, "the cut written over the odd state", func() bool {
				got, err := admin.Get(context.Background(), learnKey(r, lk.name)).Bytes()
				var st storedCap
				return err == nil && string(got) != string(odd) && json.Unmarshal(got, &st) == nil && st.Cap.Lo < 30
			})
			assert.Empty(t, learnOf(r, "p").pending, "the evidence is written")
		})
	}
}

// A ceiling lowered and raised again before the next write does not clamp
// the fleet's state: the write starts from the state as Redis has it.
func TestLearnedCapWriteStartsFromTheStoredState(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	r := New[string](redisstore.New(srv.Client(), "le-clamp"), 100, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30, Max: 64}))
	settled(t, r, "p")
	r.learned.mu.Lock()
	lk := r.learned.learning["p"]
	lk.syncingLocked() // the learner leaves p alone: this test syncs it
	r.learned.mu.Unlock()
	before, err := admin.Get(context.Background(), learnKey(r, lk.name)).Result()
	require.NoError(t, err)
	r.SetLimit("p", 10)
	r.SetLimit("p", 100)
	r.learned.mu.Lock()
	at := time.Now()
	// A start at 31, over the fleet's cap of 30: a probe, evidence to write.
	r.learned.noteLocked(lk, learnEvent{kind: evStarted, n: 31, id: uint64(at.UnixMicro()), now: at.UnixNano()})
	r.learned.mu.Unlock()
	r.syncLearned("p", lk)
	raw, err := admin.Get(context.Background(), learnKey(r, lk.name)).Bytes()
	require.NoError(t, err)
	var st storedCap
	require.NoError(t, json.Unmarshal(raw, &st))
	assert.Equal(t, 30, st.Cap.Lo, "the fleet's cap, not this process's passing ceiling of 10")
	assert.NotEqual(t, before, string(raw), "the evidence is written")
}

// A state set and not published (here an ACL without PUBLISH) is written
// all the same: its evidence is not applied again, and the failure is
// logged.
func TestLearnedCapSetNotPublished(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	require.NoError(t, admin.Do(context.Background(), "ACL", "SETUSER", "nopublish", "on", ">pw", "~*", "&*", "+@all", "-publish").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nopublish", Password: "pw"})
	defer c.Close()
	var logged atomic.Int64
	r := New[string](redisstore.New(c, "le-nopub"), 100, WithLogger(slog.New(recordHandler{match: "not published", n: &logged})))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 30, Max: 64}))
	settled(t, r, "p")
	held := holdP(t, 30, r)
	r.Report(held[29], upstream.Verdict{Kind: upstream.Concurrency})
	for _, s := range held {
		s.Release()
	}
	l := learnOf(r, "p")
	assert.Empty(t, l.pending, "the cut is written when Report returns")
	assert.Positive(t, logged.Load(), "its message could not go")
	raw, err := admin.Get(context.Background(), learnKey(r, l.name)).Bytes()
	require.NoError(t, err)
	var st storedCap
	require.NoError(t, json.Unmarshal(raw, &st))
	assert.Equal(t, l.stored.V, st.V, "Redis has the version this process knows")
	assert.Less(t, st.Cap.Lo, 30, "the cut")
}
