package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// The overrides' record goes on the learned states' channel; a Registry
// that learns caps leaves it alone (it used to take any record it could not
// read as a reason to read every learned state again), and no learned cap
// can take the overrides' name.
func TestOverridesRecordIsNotALearnedState(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		r := New[string](memstore.New(), 100)
		defer r.Close()
		require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
		synctest.Wait() // settled: time stands until the test blocks
		stale := func() uint64 {
			r.learned.mu.Lock()
			defer r.learned.mu.Unlock()
			return r.learned.learning["p"].staleN
		}
		before := stale()
		rec, err := json.Marshal(overridesRecord{V: 7, Key: overridesPrefix + "orgs", Limits: map[string]int{"p": 1}})
		require.NoError(t, err)
		r.learnedMessage(string(rec))
		assert.Equal(t, before, stale(), "no learned state marked to be read again")
		r.learnedMessage("not a record")
		assert.Greater(t, stale(), before, "as one that cannot be read is")
		assert.Equal(t, 10, r.Learned("p").Cap)

		assert.ErrorIs(t, r.Learn(overridesPrefix+"orgs", upstream.AdaptiveConfig{Initial: 1}), registry.ErrInvalidKey)
	})
}

// A store that lost its data gets the overrides back from the first
// process that reads it, as that process knew them; its onChange is told
// nothing (nothing changed). While the store is down, a change fails and
// the copy stays. A record the store holds that cannot be read fails the
// reads, and a change writes over it.
func TestOverridesOutliveTheStoresData(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	var mu sync.Mutex
	var told []string
	ov, err := NewOverrides(ms, "orgs", func(name string) { mu.Lock(); told = append(told, name); mu.Unlock() }, nil)
	require.NoError(t, err)
	defer ov.Close()
	for range 3 {
		require.NoError(t, ov.Set(ctx, "a", 1))
		require.NoError(t, ov.Set(ctx, "a", 2))
	}
	require.NoError(t, ov.Set(ctx, "b", 0))

	ms.Kill()
	assert.Error(t, ov.Set(ctx, "c", 1), "the store is down")
	assert.Error(t, ov.Sync(ctx))
	assert.Equal(t, map[string]int{"a": 2, "b": 0}, ov.All(), "the copy stays")

	ms.Restart() // empty
	require.NoError(t, ov.Sync(ctx))
	assert.Equal(t, map[string]int{"a": 2, "b": 0}, ov.All())
	other, err := NewOverrides(ms, "orgs", nil, nil)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Sync(ctx))
	assert.Equal(t, map[string]int{"a": 2, "b": 0}, other.All(), "written back to the store")
	mu.Lock()
	assert.Equal(t, []string{"a", "a", "a", "a", "a", "a", "b"}, told, "each change told, the loss not")
	mu.Unlock()
	require.NoError(t, other.Set(ctx, "a", 3))
	require.NoError(t, ov.Sync(ctx))
	n, _ := ov.Get("a")
	assert.Equal(t, 3, n, "a change after the loss holds")

	// A record without a version, as a bug or a hand would leave it.
	_, err = ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "broken", Presumed: "-", State: `{"limits":{"a":1}}`, TTL: time.Hour})
	require.NoError(t, err)
	broken, err := NewOverrides(ms, "broken", nil, nil)
	require.NoError(t, err)
	defer broken.Close()
	assert.ErrorIs(t, broken.Sync(ctx), driver.ErrBadReply)
	require.NoError(t, broken.Set(ctx, "a", 2), "a change writes over it")
	require.NoError(t, broken.Sync(ctx))
	assert.Equal(t, map[string]int{"a": 2}, broken.All())

	ov.Close()
	assert.ErrorIs(t, ov.Set(ctx, "a", 1), ErrClosed)
	assert.ErrorIs(t, ov.Sync(ctx), ErrClosed)
}

// A panic in onChange is logged and goes no further: the change holds, and
// a change of another name is still told.
func TestOverridesOnChangePanics(t *testing.T) {
	ctx := context.Background()
	var logged testrig.Buffer
	var mu sync.Mutex
	var told []string
	ov, err := NewOverrides(memstore.New(), "orgs", func(name string) {
		mu.Lock()
		told = append(told, name)
		mu.Unlock()
		if name == "bad" {
			panic("the callback's bug")
		}
	}, slog.New(slog.NewTextHandler(&logged, nil)))
	require.NoError(t, err)
	defer ov.Close()
	require.NoError(t, ov.Set(ctx, "bad", 1))
	n, ok := ov.Get("bad")
	assert.True(t, ok && n == 1)
	require.NoError(t, ov.Set(ctx, "good", 2))
	mu.Lock()
	assert.Equal(t, []string{"bad", "good"}, told)
	mu.Unlock()
	assert.Contains(t, logged.String(), "onChange panicked")
	_, err = NewOverrides(nil, "orgs", nil, nil)
	assert.Error(t, err, "a nil store")
	assert.Contains(t, logged.String(), "the callback's bug")
}

// flakyStore is a memstore a test can cut off from one process (its calls
// fail, the messages to it are dropped), or whose next write's answer it
// can lose (the write is made, the answer says it was not).
type flakyStore struct {
	*memstore.Store
	cut       atomic.Bool
	loseWrite atomic.Bool
}

func (f *flakyStore) SyncLearned(ctx context.Context, c *driver.LearnedCall) (driver.LearnedResult, error) {
	if f.cut.Load() {
		return driver.LearnedResult{}, errors.New("cut off")
	}
	res, err := f.Store.SyncLearned(ctx, c)
	if c.State != "" && res.Wrote && f.loseWrite.CompareAndSwap(true, false) {
		return driver.LearnedResult{}, nil // as a retry that found its own write would answer
	}
	return res, err
}

func (f *flakyStore) Listen(ctx context.Context, proc string, l driver.Listener) {
	f.Store.Listen(ctx, proc, flakyListener{l, f})
}

type flakyListener struct {
	driver.Listener
	f *flakyStore
}

func (l flakyListener) Learned(state string) {
	if !l.f.cut.Load() {
		l.Listener.Learned(state)
	}
}

// After the store lost its data, the latest copy wins: a process cut off
// while the others deleted a name and set another writes its older copy
// back first, and the process with the later copy writes its own back over
// it, which the first then takes.
func TestOverridesLatestCopyWinsAfterALoss(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	a, err := NewOverrides(ms, "orgs", nil, nil)
	require.NoError(t, err)
	defer a.Close()
	fb := &flakyStore{Store: ms}
	b, err := NewOverrides(fb, "orgs", nil, nil)
	require.NoError(t, err)
	defer b.Close()

	require.NoError(t, a.Set(ctx, "x", 1))
	require.NoError(t, b.Sync(ctx))
	fb.cut.Store(true)
	_, err = a.Delete(ctx, "x")
	require.NoError(t, err)
	require.NoError(t, a.Set(ctx, "y", 2))
	ms.Kill()
	ms.Restart() // empty
	fb.cut.Store(false)

	require.NoError(t, b.Sync(ctx)) // writes {x:1} back
	require.NoError(t, a.Sync(ctx)) // finds it older than its own: writes {y:2} back
	require.NoError(t, b.Sync(ctx))
	assert.Equal(t, map[string]int{"y": 2}, a.All())
	assert.Equal(t, map[string]int{"y": 2}, b.All(), "the later copy won")
}

// A record the store holds that cannot be read is written over by a
// process's copy at its next read: no override is lost, and changes go on.
// A Delete whose write went through but whose answer was lost still says
// there was one.
func TestOverridesUnreadableRecordAndLostAnswers(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	fs := &flakyStore{Store: ms}
	ov, err := NewOverrides(fs, "orgs", nil, nil)
	require.NoError(t, err)
	defer ov.Close()
	require.NoError(t, ov.Set(ctx, "a", 1))
	require.NoError(t, ov.Set(ctx, "b", 2))
	res, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "orgs", TTL: time.Hour})
	require.NoError(t, err)
	res, err = ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "orgs", Presumed: res.Version, State: `{"limits":{}}`, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, res.Wrote)

	require.NoError(t, ov.Sync(ctx))
	require.NoError(t, ov.Set(ctx, "c", 3))
	other, err := NewOverrides(ms, "orgs", nil, nil)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Sync(ctx))
	assert.Equal(t, map[string]int{"a": 1, "b": 2, "c": 3}, other.All())

	fs.loseWrite.Store(true)
	had, err := ov.Delete(ctx, "a")
	require.NoError(t, err)
	assert.True(t, had, "the delete was made; its answer was lost")
	require.NoError(t, other.Sync(ctx))
	assert.Equal(t, map[string]int{"b": 2, "c": 3}, other.All())
}

// A record in a later format (a later release's, during a rolling deploy)
// is neither read nor written over: reads and changes fail with
// ErrOverridesFormat, the copy stays, and the record is as it was; its
// messages are not taken.
func TestOverridesLeaveALaterFormatAlone(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	ov, err := NewOverrides(ms, "orgs", nil, nil)
	require.NoError(t, err)
	defer ov.Close()
	require.NoError(t, ov.Set(ctx, "a", 1))
	res, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "orgs", TTL: time.Hour})
	require.NoError(t, err)
	later := `{"v":` + fmt.Sprint(ov.seen()+1) + `,"k":"\u0000overrides/orgs","f":2,"limits":{"a":{"requests":5}}}`
	res, err = ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "orgs", Presumed: res.Version, State: later, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, res.Wrote)

	assert.ErrorIs(t, ov.Sync(ctx), ErrOverridesFormat)
	assert.ErrorIs(t, ov.Set(ctx, "b", 2), ErrOverridesFormat)
	_, err = ov.Delete(ctx, "a")
	assert.ErrorIs(t, err, ErrOverridesFormat)
	assert.Equal(t, map[string]int{"a": 1}, ov.All(), "the copy stays")
	res, err = ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "orgs", TTL: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, later, res.State, "left as it was")
}

// slowStore is a memstore whose calls to the overrides' record take a
// while, once the test says so: as a store just back from a restart
// answers, within the overrides' read timeout.
type slowStore struct {
	*memstore.Store
	slow atomic.Bool
}

// slowCall is how long a slowStore's call takes: a read and its write-back
// together within the overrides' read timeout.
const slowCall = 400 * time.Millisecond

func (s *slowStore) SyncLearned(ctx context.Context, c *driver.LearnedCall) (driver.LearnedResult, error) {
	if s.slow.Load() {
		t := time.NewTimer(slowCall)
		select {
		case <-ctx.Done():
			t.Stop()
			return driver.LearnedResult{}, ctx.Err()
		case <-t.C:
		}
	}
	return s.Store.SyncLearned(ctx, c)
}

// A process that has seen no overrides, changing them in a store that lost
// its data, waits until the processes that knew them have written them
// back: each reads every second, and a read with its write-back may take a
// second too (its timeout). It used to wait one second only, and the record
// of its change alone then went over theirs, later than their copies, which
// took it: org x, turned off, was on again on every process.
func TestOverridesWaitForTheWriteBackOfASlowStore(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ctx := context.Background()
		ms := memstore.New()
		slow := &slowStore{Store: ms}
		a, err := NewOverrides(slow, "orgs", nil, nil)
		require.NoError(t, err)
		defer a.Close()
		require.NoError(t, a.Set(ctx, "x", 0))
		slow.slow.Store(true)

		// Just after a's read of this second has found the record (its
		// reads begin on the bubble's whole seconds): a finds the store
		// empty at its next read, and writes its copy back a call later.
		time.Sleep(overridesRefresh - time.Duration(time.Now().UnixNano()%int64(overridesRefresh)) + overridesRefresh/2)
		ms.Kill()
		ms.Restart() // empty
		c, err := NewOverrides(ms, "orgs", nil, nil)
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.Set(ctx, "y", 1))

		require.NoError(t, a.Sync(ctx))
		require.NoError(t, c.Sync(ctx))
		assert.Equal(t, map[string]int{"x": 0, "y": 1}, c.All(), "c's change made over the copy written back")
		assert.Equal(t, map[string]int{"x": 0, "y": 1}, a.All())
	})
}

// racedStore is a memstore on which a change's read, once the test arms
// it, races another read of the same process: that one is served first,
// and takes the record the store has; then the store loses its data, and
// the change's read finds none. Messages to the process are dropped, so
// that it reads only when the test says.
type racedStore struct {
	*memstore.Store
	armed atomic.Bool
	other func() // the other read
}

func (s *racedStore) SyncLearned(ctx context.Context, c *driver.LearnedCall) (driver.LearnedResult, error) {
	if c.State == "" && s.armed.CompareAndSwap(true, false) {
		s.other()
		s.Kill()
		s.Restart() // empty
	}
	return s.Store.SyncLearned(ctx, c)
}

func (s *racedStore) Listen(ctx context.Context, proc string, l driver.Listener) {
	s.Store.Listen(ctx, proc, deafListener{l})
}

// deafListener drops the learned states published.
type deafListener struct{ driver.Listener }

func (deafListener) Learned(string) {}

// A change whose read finds the store older than this process's copy (it
// lost its data, or failed over to a replica that lagged) while another
// read of the process took a later record is made on the copy written
// back, not on what the store had: it used to be made on the empty record,
// and the record of that change alone, the latest, took every other
// override away from every process.
func TestOverridesChangeNotMadeOnALostRecord(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ctx := context.Background()
		ms := memstore.New()
		rs := &racedStore{Store: ms}
		a, err := NewOverrides(rs, "orgs", nil, nil)
		require.NoError(t, err)
		defer a.Close()
		b, err := NewOverrides(ms, "orgs", nil, nil)
		require.NoError(t, err)
		defer b.Close()
		require.NoError(t, a.Set(ctx, "x", 0))
		synctest.Wait() // a reads again on its next tick only: time stands until the test blocks
		require.NoError(t, b.Set(ctx, "z", 1))
		rs.other = func() { assert.NoError(t, a.Sync(ctx)) }
		rs.armed.Store(true)

		require.NoError(t, a.Set(ctx, "y", 2))
		assert.False(t, rs.armed.Load(), "the race was run")
		assert.Equal(t, map[string]int{"x": 0, "y": 2, "z": 1}, a.All())
		require.NoError(t, b.Sync(ctx))
		assert.Equal(t, map[string]int{"x": 0, "y": 2, "z": 1}, b.All())
	})
}

// A record whose version is the highest there is (a hostile or broken
// writer's) leaves no version over it: a change written on it, under a
// version that wrapped around, would be older than the copy that read it,
// and the copy written back over it at the next read. It is taken for a
// record that cannot be read, and written over by the copy.
func TestOverridesTopVersionIsWrittenOver(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	ov, err := NewOverrides(ms, "orgs", nil, nil)
	require.NoError(t, err)
	defer ov.Close()
	require.NoError(t, ov.Set(ctx, "a", 1))
	res, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "orgs", TTL: time.Hour})
	require.NoError(t, err)
	top := `{"v":18446744073709551615,"k":"\u0000overrides/orgs","f":1,"limits":{"a":1}}`
	res, err = ms.SyncLearned(ctx, &driver.LearnedCall{Key: overridesPrefix + "orgs", Presumed: res.Version, State: top, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, res.Wrote)

	_ = ov.Sync(ctx)
	require.NoError(t, ov.Set(ctx, "b", 2))
	assert.Equal(t, map[string]int{"a": 1, "b": 2}, ov.All())
	require.NoError(t, ov.Sync(ctx))
	other, err := NewOverrides(ms, "orgs", nil, nil)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Sync(ctx))
	assert.Equal(t, map[string]int{"a": 1, "b": 2}, other.All(), "the change holds")
}
