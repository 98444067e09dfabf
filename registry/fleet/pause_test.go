package fleet

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// A lease TTL of a minute keeps the heartbeats out of the way in these
// tests: renewals come when the test calls renew. The pause is then 21 s
// (a renewal round of 20 s, and twice the call timeout of 500 ms), on the
// server's clock, which the tests move.
const (
	pauseTTL  = time.Minute
	pauseWait = 21 * time.Second
)

// knowing returns a Registry on m that has seen the current epoch (it made
// one admission), as every process of a running fleet has.
func knowing(t *testing.T, m *mini, limit int, opts ...Option) *Registry[string] {
	t.Helper()
	r := m.registry(limit, append([]Option{WithLeaseTTL(pauseTTL)}, opts...)...)
	r.SetLimit("warm-up", slots.Unlimited) // each Registry its own, whatever the others' release
	s, err := r.TryAcquire("warm-up")
	require.NoError(t, err)
	s.Release()
	require.NotZero(t, r.epoch.Load())
	return r
}

// lose makes Redis lose its data, as a restart without persistence does,
// a moment later (an epoch is the server's time at its making: on a clock
// that stood still, the new one would be the old one).
func lose(m *mini) {
	m.advance(time.Millisecond)
	m.Srv.FlushAll()
}

// After Redis lost its data, new admissions wait one renewal round while
// live holders put their leases back: a TryAcquire meanwhile gets the
// usual limit error, with a Retry-After for the end of the pause; the
// holder's renewal is not held back; at the end of the pause admissions
// resume, against the holder's lease.
func TestPauseAfterDataLoss(t *testing.T) {
	m := newMini(t)
	holder := knowing(t, m, 2)
	other := knowing(t, m, 2)
	require.Equal(t, pauseWait, other.pause)
	held, err := holder.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	id := m.leases("k")[0]

	lose(m)
	_, err = other.TryAcquire("k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, ErrPaused)
	assert.ErrorIs(t, err, slots.ErrLimitReached, "answered as any refusal at the cap")
	assert.Equal(t, "k", le.Key)
	// Told as a pause: "too many requests in flight: 0 of 2" before.
	assert.Equal(t, "new requests wait while the fleet's store takes back the requests in flight it lost", slots.ErrorMessage(err))
	assert.Equal(t, 2, le.Limit)
	assertPauseLeft(t, le, pauseWait)
	assert.Subset(t, []string{id}, m.leases("k"), "nothing admitted but the holder's lease")
	until, err := m.Srv.Get("inflight:{t}#pause")
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(m.Now.Add(pauseWait).UnixMilli(), 10), until, "the pause, on the server's clock")

	require.True(t, holder.renew(), "the holder's renewal is not held back")
	assert.Equal(t, []string{id}, m.leases("k"), "its lease is back")
	st := holder.Stats()
	assert.Equal(t, uint64(1), st.Lost)
	assert.Equal(t, uint64(1), st.Reasserted)

	m.advance(pauseWait - 1500*time.Millisecond)
	_, err = other.TryAcquireAll("k", "m")
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, ErrPaused, "still paused")
	assert.Equal(t, "k", le.Key, "a paused refusal names the first key")
	assert.Equal(t, 1, le.InFlight)
	assertPauseLeft(t, le, 1500*time.Millisecond)
	m.advance(1500 * time.Millisecond)
	s, err := other.TryAcquire("k")
	require.NoError(t, err, "the pause is over")
	assert.False(t, s.Degraded())
	assert.Len(t, m.leases("k"), 2)
	_, err = other.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the holder's lease counts")
	assert.NotErrorIs(t, err, ErrPaused)
	s.Release()
	assert.Equal(t, uint64(2), other.Stats().Paused, "each paused try")
}

// assertPauseLeft asserts that a caller refused while left of a pause
// remains is told to come back at its end, to the millisecond, and a
// turn of the key later: here, where holds take microseconds, within
// 100 ms.
func assertPauseLeft(t *testing.T, le *slots.LimitError, left time.Duration) {
	t.Helper()
	assert.GreaterOrEqual(t, le.RetryAfter, left, "not before the pause ends")
	assert.Less(t, le.RetryAfter, left+100*time.Millisecond, "the pause's end, to the millisecond")
}

// fullAfterHolds returns a virtual Redis and two processes of the fleet
// named name on it, with a limit of 2: other has held k three times for a
// second, and holder holds k's two slots until the test's end. Call it in
// a bubble.
func fullAfterHolds(t *testing.T, name string) (srv *virtualRedis, holder, other *Registry[string]) {
	srv = newVirtualRedis(t, fwLatency)
	rs := fwFleet(t, srv, name, 2, 2, WithLogger(quiet()))
	holder, other = rs[0], rs[1]
	for range 3 {
		s, err := other.Acquire(context.Background(), "k")
		require.NoError(t, err)
		time.Sleep(time.Second)
		s.Release()
	}
	for range 2 {
		s, err := holder.Acquire(context.Background(), "k")
		require.NoError(t, err)
		t.Cleanup(func() { s.Release() })
	}
	return srv, holder, other
}

// Callers refused during a pause are told its end, and after it one by
// one as the key's slots free (its holds take a second here), not all
// the same instant. In virtual time, on a virtual Redis.
func TestPausedCallersComeBackOneByOne(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv, _, other := fullAfterHolds(t, "paused")
		synctest.Wait()
		srv.srv.FlushAll()
		var told []time.Duration
		for range 6 {
			_, err := other.TryAcquire("k")
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			require.ErrorIs(t, err, ErrPaused)
			told = append(told, le.RetryAfter)
		}
		t.Logf("a pause of %v; told %v", other.pause, told)
		assert.GreaterOrEqual(t, told[0], other.pause-time.Second, "not before the pause ends")
		assert.Less(t, told[0], other.pause+time.Second, "the first at the pause's end, give or take a turn")
		for i := 1; i < len(told); i++ {
			assert.Greater(t, told[i], told[i-1], "caller %d after the one before", i)
		}
		assert.GreaterOrEqual(t, told[5]-told[0], 2*time.Second, "six callers over two slots of a second: three rounds")
	})
}

// A waiter whose longest wait ends during a pause is told to come back
// once the pause has ended, not from the key's holds as if it were over.
// In virtual time, on a virtual Redis.
func TestTimedOutDuringAPauseComesBackAfterIt(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		rs := fwFleet(t, srv, "paused-wait", 2, 1, WithLogger(quiet()),
			WithLocalOptions(slots.WithMaxWait(500*time.Millisecond)))
		holder, other := rs[0], rs[1]
		s, err := other.Acquire(context.Background(), "k") // other has seen the epoch
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond) // a hold of k ended here
		s.Release()
		s, err = holder.Acquire(context.Background(), "k")
		require.NoError(t, err)
		defer s.Release()
		synctest.Wait()
		srv.srv.FlushAll()
		start := time.Now()
		_, err = other.Acquire(context.Background(), "k")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		waited := time.Since(start)
		t.Logf("a pause of %v; timed out after %v, told %v", other.pause, waited, le.RetryAfter)
		assert.GreaterOrEqual(t, waited+le.RetryAfter, other.pause, "not back before the pause ends")
		assert.Less(t, waited+le.RetryAfter, other.pause+time.Second, "nor long after it")
		assert.Zero(t, le.RetryAfter%time.Millisecond, "to the millisecond")
	})
}

// The tries of a waiter during a pause (a queued one asks every claim
// window) book no return: the callers refused meanwhile are still told
// one after another from the pause's end, not the bound of the returns
// told (eight rounds of the key), all the same; and one refused later in
// the pause after them. In virtual time, on a virtual Redis.
func TestPausedWaitersDoNotPushTriesBack(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv, holder, other := fullAfterHolds(t, "paused-waiters")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { // queued in the store before the loss
			if s, err := other.Acquire(ctx, "k"); err == nil {
				s.Release()
			}
		}()
		time.Sleep(100 * time.Millisecond) // its call's round trip
		synctest.Wait()
		srv.srv.FlushAll()
		_, err := holder.TryAcquire("k") // the pause starts
		require.ErrorIs(t, err, ErrPaused)
		start := time.Now()
		time.Sleep(5 * time.Second) // the waiter asks a few times meanwhile
		var told []time.Duration
		for range 3 {
			_, err := other.TryAcquire("k")
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			require.ErrorIs(t, err, ErrPaused)
			told = append(told, le.RetryAfter)
		}
		left := other.pause - time.Since(start)
		t.Logf("%v of the pause left; told %v", left, told)
		assert.GreaterOrEqual(t, told[0], left, "not before the pause ends")
		assert.Less(t, told[0], left+2*time.Second, "the pause's end, and a turn or two")
		for i := 1; i < len(told); i++ {
			assert.Greater(t, told[i], told[i-1], "caller %d after the one before", i)
		}
		// One refused 2 s later comes back after them too: the returns
		// are booked as from the pause's end, not due (and dropped)
		// before it.
		back := start.Add(5*time.Second + told[len(told)-1])
		time.Sleep(2 * time.Second)
		_, err = other.TryAcquire("k")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, ErrPaused)
		assert.True(t, time.Now().Add(le.RetryAfter).After(back), "told %v, 2 s later", le.RetryAfter)
	})
}

// A waiting Acquire keeps waiting through the pause, and is admitted when
// it ends; one whose context ends meanwhile gets the context's error, and
// nothing stays in Redis.
func TestAcquireWaitsThroughPause(t *testing.T) {
	m := newMini(t)
	r := knowing(t, m, 1)
	lose(m)

	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() {
		_, err := r.Acquire(ctx, "other")
		cancelled <- err
	}()
	type result struct {
		s   *slots.Slot
		err error
	}
	got := make(chan result, 1)
	go func() {
		s, err := r.Acquire(context.Background(), "k")
		got <- result{s, err}
	}()
	eventually(t, "both refused as paused", func() bool { return r.Stats().Paused >= 2 })
	assert.Equal(t, 2, r.Stats().Waiting, "still waiting")
	cancel()
	select {
	case err := <-cancelled:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter whose context ended went on waiting")
	}
	assert.Empty(t, m.leases("other"))

	m.advance(pauseWait)
	r.wakeAll() // rather than wait for the end of the pause on the test's clock
	select {
	case res := <-got:
		require.NoError(t, res.err)
		assert.Len(t, m.leases("k"), 1)
		res.s.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not admitted after the pause")
	}
	eventually(t, "nothing left", func() bool { return len(m.leases("k")) == 0 && r.Stats().Waiting == 0 })
	assert.Equal(t, uint64(1), r.Stats().Rejected, "the cancelled waiter alone")
}

// Redis cannot tell a loss from a first start; a process that has not
// seen an epoch cannot either, and is not held back. A process that saw
// the old epoch pauses admissions when it first calls, until the new
// epoch's birth plus the pause: what is left of the round.
func TestPauseCountsFromTheEpochsBirth(t *testing.T) {
	m := newMini(t)
	fresh := m.registry(2, WithLeaseTTL(pauseTTL))
	s, err := fresh.TryAcquire("k")
	require.NoError(t, err, "a first start is not paused")
	s.Release()

	old := knowing(t, m, 2)
	lose(m)
	newcomer := m.registry(2, WithLeaseTTL(pauseTTL))
	s, err = newcomer.TryAcquire("k")
	require.NoError(t, err, "a process that never saw the old epoch cannot tell the loss")
	defer s.Release()

	m.advance(5 * time.Second)
	_, err = old.TryAcquire("k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, ErrPaused, "the loss told by a process that saw the old epoch")
	assertPauseLeft(t, le, pauseWait-5*time.Second) // counted from the epoch's birth
	_, err = newcomer.TryAcquire("k")
	assert.ErrorIs(t, err, ErrPaused, "every process honours it")

	m.advance(pauseWait - 5*time.Second)
	late, err := old.TryAcquire("k")
	require.NoError(t, err)
	late.Release()
}

// Leases missing while the epoch stayed (they expired; a failover to a
// replica that had the epoch but not the leases looks the same) pause
// nothing.
func TestMissingLeasesWithTheEpochPauseNothing(t *testing.T) {
	m := newMini(t)
	holder := knowing(t, m, 1)
	other := knowing(t, m, 1)
	held, err := holder.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	m.Srv.Del("inflight:{t}:k")
	s, err := other.TryAcquire("k")
	require.NoError(t, err)
	s.Release()
	assert.Zero(t, other.Stats().Paused)
	assert.False(t, m.Srv.Exists("inflight:{t}#pause"))
}

// A Registry that puts no lost lease back (ReportLost, CancelLost)
// declares the pause all the same: the other processes' holders may be
// live. First to find the loss, it would otherwise let new leases into
// the emptied key before they came back.
func TestReportLostDeclaresThePause(t *testing.T) {
	for _, policy := range []Lost{ReportLost, CancelLost} {
		m := newMini(t)
		holder := knowing(t, m, 1)
		other := knowing(t, m, 1, WithLostLeases(policy))
		held, err := holder.TryAcquire("k")
		require.NoError(t, err)
		lose(m)
		_, err = other.TryAcquire("k")
		require.ErrorIs(t, err, ErrPaused, "the first to find the loss declares the pause")
		require.True(t, holder.renew())
		assert.Len(t, m.leases("k"), 1, "the holder's lease is back, and nothing else")
		held.Release()
	}
}

// An admission whose keys are all at slots.Unlimited takes no part in a
// pause: there is no cap to keep.
func TestUnlimitedKeysAreNotPaused(t *testing.T) {
	m := newMini(t)
	r := knowing(t, m, 2) // "warm-up" is Unlimited
	lose(m)
	s, err := r.TryAcquire("warm-up")
	require.NoError(t, err)
	s.Release()
	_, err = r.TryAcquireAll("warm-up", "k")
	assert.ErrorIs(t, err, ErrPaused, "with a capped key, it waits")
}

// Processes with other TTLs wait alike: one whose TTL is shorter honours a
// pause declared by one whose TTL is longer to its end.
func TestAShorterTTLHonoursTheWholePause(t *testing.T) {
	m := newMini(t)
	long := knowing(t, m, 1, WithLeaseTTL(30*time.Second)) // renews every 10 s, pause 11 s
	short := knowing(t, m, 1, WithLeaseTTL(9*time.Second))
	held, err := long.TryAcquire("k")
	require.NoError(t, err)
	lose(m)
	_, err = long.TryAcquire("other")
	require.ErrorIs(t, err, ErrPaused) // declared: until the birth + 11 s
	m.advance(9 * time.Second)
	_, err = short.TryAcquire("k")
	require.ErrorIs(t, err, ErrPaused, "past its own TTL, still the declared pause")
	m.advance(time.Second) // the long process's renewal round
	require.True(t, long.renew())
	assert.Len(t, m.leases("k"), 1)
	held.Release()
}

// A server clock that steps back (an NTP step, a failover to a replica
// whose clock is behind) does not stretch a pause by the step.
func TestAPauseAfterTheClockStepsBack(t *testing.T) {
	m := newMini(t)
	r := knowing(t, m, 2)
	lose(m)
	_, err := r.TryAcquire("k")
	require.ErrorIs(t, err, ErrPaused)
	m.advance(-time.Hour)
	s, err := r.TryAcquire("k")
	require.NoError(t, err, "a pause an hour ahead of now is not honoured")
	s.Release()
}
