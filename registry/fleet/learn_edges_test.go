package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/slots"
)

// The edges of a learned cap: panics in what it calls, syncs that race
// with evidence, settings and messages, and states it cannot trust.

// stateHook runs fn once, when armed, around a GET of a learned state:
// before it if before, else after it.
type stateHook struct {
	armed  atomic.Bool
	before bool
	fn     func()
}

func (h *stateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		hit := cmd.Name() == "get" && len(a) > 1 && strings.Contains(fmt.Sprint(a[1]), "#learn:")
		if hit && h.before && h.armed.CompareAndSwap(true, false) {
			h.fn()
		}
		err := next(ctx, cmd)
		if hit && !h.before && h.armed.CompareAndSwap(true, false) {
			h.fn()
		}
		return err
	}
}
func (h *stateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// lockFree reports whether r.mu can be taken within a second.
func lockFree(r *Registry[string]) bool {
	done := make(chan struct{})
	go func() { r.mu.Lock(); r.mu.Unlock(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(time.Second):
		return false
	}
}

// learnOf returns a copy of key's learning in r, under r.mu.
func learnOf(r *Registry[string], key string) learning {
	r.mu.Lock()
	defer r.mu.Unlock()
	return *r.learning[key]
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
	srv := fleettest.Start(t)
	var fired atomic.Bool
	r := New[string](srv.Client(), "le-log", 100, WithLogger(slog.New(panicHandler{match: "learned cap", fired: &fired})))
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 10}))
	s, err := r.TryAcquire("p")
	require.NoError(t, err)
	r.Report(s, pacing.Verdict{Kind: pacing.Concurrency})
	require.True(t, fired.Load())
	require.True(t, lockFree(r), "r.mu left locked by a panicking log handler")
	s.Release()
}

// A LimitFunc that panics in the learner's round leaves r.mu free.
func TestLearnedCapLimitFuncPanics(t *testing.T) {
	srv := fleettest.Start(t)
	var armed, fired atomic.Bool
	r := NewWithKeys(srv.Client(), "le-limitfunc", 100, Keys[string]{Limit: func(string) int {
		if armed.CompareAndSwap(true, false) {
			fired.Store(true)
			panic("limit func panics")
		}
		return 50
	}}, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{}))
	settled(t, r, "p")
	armed.Store(true)
	fwUntil(t, "the learner calls Keys.Limit", fired.Load)
	require.True(t, lockFree(r), "r.mu left locked by a Keys.Limit panic in the learner")
	settled(t, r, "p") // and it goes on
}

// A panic in one key's sync (a client hook) does not strand the other
// keys of the round: each is read again.
func TestLearnedCapSyncPanics(t *testing.T) {
	srv := fleettest.Start(t)
	c := srv.Client()
	h := &stateHook{before: true, fn: func() { panic("hook panics") }}
	c.AddHook(h)
	r := New[string](c, "le-strand", 100, WithLogger(quiet()))
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{}))
	require.NoError(t, r.Learn("q", pacing.AdaptiveConfig{}))
	settled(t, r, "p")
	settled(t, r, "q")
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
	srv := fleettest.Start(t)
	c := srv.Client()
	var r *Registry[string]
	h := &stateHook{}
	h.fn = func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		lk := r.learning["p"]
		for i := range 300 {
			r.noteLocked(lk, learnEvent{kind: evStarted, n: lk.cap.Lo + 1, now: time.Now().Add(time.Hour).UnixNano() + int64(i)})
		}
	}
	c.AddHook(h)
	r = New[string](c, "le-pending", 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{}))
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
	srv := fleettest.Start(t)
	c := srv.Client()
	var r *Registry[string]
	h := &stateHook{}
	h.fn = func() { _ = r.Learn("p", pacing.AdaptiveConfig{Max: 8}) }
	c.AddHook(h)
	r = New[string](c, "le-relearn", 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Max: 64, Initial: 30}))
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
	srv := fleettest.Start(t)
	c := srv.Client()
	other := srv.Client()
	var r *Registry[string]
	h := &stateHook{}
	h.fn = func() {
		lk := learnOf(r, "p")
		st := storedCap{Key: "p", V: lk.version + 5, Cap: lk.cap}
		st.Cap.Lo, st.Cap.Hi, st.Cap.HiAt = 2, 2, time.Now().UnixNano()
		b, err := json.Marshal(st)
		if err == nil {
			err = other.Set(context.Background(), lk.stateKey, b, time.Hour).Err()
		}
		if err == nil {
			err = other.Publish(context.Background(), r.learnChan, b).Err()
		}
		if err != nil {
			panic(err)
		}
		for learnOf(r, "p").version != st.V { // the message taken, before this sync ends
			time.Sleep(time.Millisecond) // polling a condition
		}
	}
	c.AddHook(h)
	r = New[string](c, "le-stale", 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 30}))
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
	srv := fleettest.Start(t)
	r := New[string](srv.Client(), "le-path", 100)
	defer r.Close()
	keys := []string{"a", "b", "c", "d", "e", "f"}
	for _, k := range keys[:5] {
		require.NoError(t, r.Learn(k, pacing.AdaptiveConfig{Initial: 10}))
	}
	s, err := r.TryAcquireAll(keys...)
	require.NoError(t, err)
	r.Report(s, pacing.Verdict{Kind: pacing.Concurrency})
	s.Release()
	assert.Equal(t, 10, r.Learned("d").Cap, "d is not the last learned key")
	assert.Less(t, r.Learned("e").Cap, 10, "e, the last learned key, takes the refusal")
}

// After Forget the local registry follows the LimitFunc again.
func TestForgetReturnsTheLocalLimit(t *testing.T) {
	srv := fleettest.Start(t)
	var lim atomic.Int64
	lim.Store(10)
	r := NewWithKeys(srv.Client(), "le-forget", 100, Keys[string]{Limit: func(string) int { return int(lim.Load()) }})
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 4}))
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
	srv := fleettest.Start(t)
	c := srv.Client()
	r := New[string](c, "le-ttl", 100)
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 10, Max: 64}))
	settled(t, r, "p")
	key := r.learnPrefix + "p"
	require.NoError(t, c.PExpire(context.Background(), key, 3*time.Second).Err()) // as if the day had nearly passed
	fwUntil(t, "a read gives it a day again", func() bool { return c.PTTL(context.Background(), key).Val() > time.Hour })
}

// startCeiling is over the number of every start admitted before it is
// read, by any process.
func TestStartCeiling(t *testing.T) {
	srv := fleettest.Start(t)
	rs := fwFleet(t, srv, "le-ceiling", 2, 1000)
	s, err := rs[0].TryAcquire("warm")
	require.NoError(t, err)
	s.Release()
	bad := 0
	for i := range 1000 {
		s, err := rs[1].TryAcquire("k")
		require.NoError(t, err)
		id := (*core.Handle)(s).Hold().Owner.(*lease[string]).start.id
		if ceil := rs[0].clock.startCeiling(); id > ceil {
			bad++
		}
		s.Release()
		if i%7 == 0 { // rs[0]'s clock told anew now and then
			if s, err := rs[0].TryAcquire("warm"); err == nil {
				s.Release()
			}
		}
	}
	assert.Zero(t, bad, "starts numbered over a ceiling read after them")
}

// A state in Redis that is not a Cap ("null", a zero value, another
// key's) is written over, as a missing one.
func TestLearnedStateNotACap(t *testing.T) {
	srv := fleettest.Start(t)
	c := srv.Client()
	r := New[string](c, "le-foreign", 100)
	defer r.Close()
	for _, v := range []string{"null", `{"k":"p","v":3,"cap":{}}`, `{"k":"q","v":3,"cap":{"lo":2,"hi":2,"step":1,"gap":1}}`} {
		require.NoError(t, c.Set(context.Background(), r.learnPrefix+"p", v, time.Hour).Err())
		r.Forget("p")
		require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 4}))
		settled(t, r, "p")
		lk := learnOf(r, "p")
		assert.NotZero(t, lk.cap.Gap, v)
		assert.Equal(t, 4, lk.cap.Lo, "the initial cap, as for a missing state: %s", v)
		assert.Contains(t, c.Get(context.Background(), r.learnPrefix+"p").Val(), `"k":"p"`, "written over: %s", v)
	}
}

// On a Redis Cluster, the state's transaction and its channel work.
func TestLearnedCapOnCluster(t *testing.T) {
	cl := fleettest.StartCluster(t, 3)
	a := New[string](cl.Client(), "le-cluster", 100)
	defer a.Close()
	b := New[string](cl.Client(), "le-cluster", 100)
	defer b.Close()
	require.NoError(t, a.Learn("p", pacing.AdaptiveConfig{Initial: 10}))
	require.NoError(t, b.Learn("p", pacing.AdaptiveConfig{Initial: 10}))
	var held []*slots.Slot
	for range 5 {
		s, err := a.TryAcquire("p")
		require.NoError(t, err)
		held = append(held, s)
	}
	a.Report(held[4], pacing.Verdict{Kind: pacing.Concurrency})
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

// A Redis that refuses the learned state's transaction (here an ACL
// without WATCH) is logged, and does not open the breaker: admissions go
// on in Redis.
func TestLearnedCapWriteRefused(t *testing.T) {
	srv := fleettest.Start(t)
	admin := srv.Client()
	require.NoError(t, admin.Do(context.Background(), "ACL", "SETUSER", "nowatch", "on", ">pw", "~*", "&*", "+@all", "-watch").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nowatch", Password: "pw"})
	defer c.Close()
	var logged atomic.Int64
	r := New[string](c, "le-acl", 100, WithLogger(slog.New(recordHandler{match: "learned cap not written", n: &logged})))
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{}))
	fwUntil(t, "the refusal logged", func() bool { return logged.Load() > 0 })
	for range 20 {
		s, err := r.TryAcquire("q")
		require.NoError(t, err)
		assert.False(t, s.Degraded(), "admitted in Redis")
		s.Release()
	}
	assert.False(t, r.Stats().BreakerOpen)
	assert.Zero(t, r.Stats().RedisErrors)
}
