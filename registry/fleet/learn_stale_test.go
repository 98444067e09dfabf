package fleet

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// cutMidCall is a store whose next admission call, once armed, first runs
// cut: a cut of a learned cap that reaches the process while its
// admission call is on its way (on PostgreSQL, a call waiting for the
// key's row lock); after, if set, runs once the store has answered, before
// the client reads the reply.
type cutMidCall struct {
	driver.Store
	armed      atomic.Bool
	cut, after func()
}

// around runs call, armed with the cut before it and after after it.
func (s *cutMidCall) around(call func()) {
	if !s.armed.CompareAndSwap(true, false) {
		call()
		return
	}
	s.cut()
	call()
	if s.after != nil {
		s.after()
	}
}

func (s *cutMidCall) Admit(ctx context.Context, calls []*driver.AdmitCall) (res []driver.AdmitResult, err error) {
	s.around(func() { res, err = s.Store.Admit(ctx, calls) })
	return res, err
}

func (s *cutMidCall) AdmitOne(ctx context.Context, call *driver.AdmitCall) (res driver.AdmitResult, err error) {
	s.around(func() { res, err = s.Store.AdmitOne(ctx, call) })
	return res, err
}

// An admission whose call went with a learned limit that a cut lowered
// before the reply came is not handed out when its count is over the new
// cap: the upstream would refuse it. A TryAcquire is refused as under a
// full key; an Acquire waits, and is admitted once the count is within
// the cap; the lease given back leaves the store (no capacity is lost).
func TestAdmissionOverACutMeanwhileIsGivenBack(t *testing.T) {
	for _, wait := range []bool{false, true} {
		name := "TryAcquire"
		if wait {
			name = "Acquire"
		}
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				s := &cutMidCall{Store: memstore.New()}
				r := learnsTen(t, New[string](s, 100, WithLogger(quiet())))
				held := holdSpaced(t, r, 9)
				require.Equal(t, 10, r.Limit("p"))
				// The ninth start is refused by the upstream, and reported
				// while the tenth's call is on its way with limit 10.
				s.cut = func() { r.Report(held[8], upstream.Verdict{Kind: upstream.Concurrency}) }
				s.armed.Store(true)
				if !wait {
					_, err := r.TryAcquire("p")
					var le *slots.LimitError
					require.True(t, errors.As(err, &le), "admitted at 10 over a cap cut to %d: %v", r.Limit("p"), err)
					assert.ErrorIs(t, err, slots.ErrLimitReached)
					assert.Equal(t, "p", le.Key)
					assert.Equal(t, 9, le.InFlight)
				} else {
					got := acquireThenRelease(r, "p")
					synctest.Wait()
					select {
					case err := <-got:
						t.Fatalf("the waiter returned (%v) at a count over the cap cut to %d", err, r.Limit("p"))
					default:
					}
					for _, sl := range held {
						sl.Release()
					}
					held = nil
					require.NoError(t, <-got, "admitted once the count is within the cap")
				}
				assert.False(t, s.armed.Load(), "the cut came mid-call")
				assert.Less(t, r.Limit("p"), 10, "the cap was cut")
				assert.Equal(t, len(held), r.Stats().Held)
				assert.Equal(t, uint64(1), r.Stats().GivenBack)
				for _, sl := range held {
					sl.Release()
				}
				// Nothing left in the store: every slot of the cap, as it
				// stands, can be taken.
				synctest.Wait() // the releases reach the store
				n, err := r.InFlight(context.Background(), "p")
				require.NoError(t, err)
				assert.Zero(t, n, "the lease given back left the store")
				n = r.Limit("p")
				again := holdP(t, n, r)
				for _, sl := range again {
					sl.Release()
				}
			})
		})
	}
}

// faultyCutStore is cutMidCall with hooks on the abandon and on the
// admission calls that follow the cut, which can also fail.
type faultyCutStore struct {
	cutMidCall
	beforeNext atomic.Pointer[func()] // run once before the next Abandon or admission after the cut
	failAdmits atomic.Int32           // the next n admission calls fail
	abandons   atomic.Pointer[[]*driver.AbandonCall]
}

var errStoreDown = errors.New("store down: connection refused")

func (s *faultyCutStore) Abandon(ctx context.Context, calls []*driver.AbandonCall) ([]error, error) {
	if f := s.beforeNext.Swap(nil); f != nil {
		(*f)()
	}
	cs := append([]*driver.AbandonCall(nil), calls...)
	s.abandons.Store(&cs)
	return s.cutMidCall.Store.Abandon(ctx, calls)
}

func (s *faultyCutStore) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if !s.armed.Load() {
		if f := s.beforeNext.Swap(nil); f != nil {
			(*f)()
		}
	}
	if !s.armed.Load() && s.failAdmits.Add(-1) >= 0 {
		return driver.AdmitResult{Err: errStoreDown}, errStoreDown
	}
	return s.cutMidCall.AdmitOne(ctx, c)
}

// An admission over a cut made meanwhile leaves the store served under the
// cut limit, not the one its call carried (10): another process's waiter,
// queued before the lease is given back, is not granted over the cap the
// process now knows.
func TestGivenBackAdmissionServesUnderTheCut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		mem := memstore.New()
		s := &faultyCutStore{cutMidCall: cutMidCall{Store: mem}}
		r := learnsTen(t, New[string](s, 100, WithLogger(quiet())))
		held := holdSpaced(t, r, 9)
		s.cut = func() { r.Report(held[8], upstream.Verdict{Kind: upstream.Concurrency}) }
		// Another process's waiter, queued while the given-back lease is in
		// the store (count 10, its limit 10).
		queued := func() {
			res, err := mem.AdmitOne(context.Background(), &driver.AdmitCall{
				Lease: "other-waiter", Keys: []string{"p"}, Limits: []int{10}, Units: 1,
				TTL: 10 * time.Second, Wait: true, Claim: time.Second, Live: 5 * time.Second,
				Weight: 1, Proc: "other", MaxQueue: -1, MaxFlowQueue: -1,
			})
			require.NoError(t, err)
			require.Equal(t, driver.StatusQueued, res.Status)
		}
		s.beforeNext.Store(&queued)
		s.armed.Store(true)
		_, err := r.TryAcquire("p")
		require.ErrorIs(t, err, slots.ErrLimitReached)
		synctest.Wait() // the abandon reaches the store
		cut := r.Limit("p")
		require.Less(t, cut, 10)
		var served []int
		if abandons := s.abandons.Load(); abandons != nil {
			served = (*abandons)[0].Limits
		}
		n, err := r.InFlight(context.Background(), "p")
		require.NoError(t, err)
		assert.LessOrEqual(t, n, max(cut, 9),
			"the given-back lease's abandon granted a waiter at %d, over the cut cap %d (the abandon served under limits %v)", n, cut, served)
		releaseAll(t, r, held)
	})
}

// A waiter whose admission over a cut is given back, and which is then
// admitted outside the store (its next call fails: FallbackLocal admits it
// under the local registry), carries no start: a report on its Slot
// changes no cap, as for any Slot admitted while the store is unreachable.
func TestGivenBackStartIsNoEvidence(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		s := &faultyCutStore{cutMidCall: cutMidCall{Store: memstore.New()}}
		r := learnsTen(t, New[string](s, 100, WithLogger(quiet())))
		held := holdSpaced(t, r, 9)
		s.cut = func() {
			r.Report(held[8], upstream.Verdict{Kind: upstream.Concurrency})
			time.Sleep(5 * time.Millisecond) // the call waits for the row lock: its start is after the cut
			s.failAdmits.Store(1 << 20)      // the store is unreachable from the waiter's next call on
		}
		s.armed.Store(true)
		got := make(chan *slots.Slot, 1)
		go func() {
			sl, err := r.Acquire(context.Background(), "p")
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			got <- sl
		}()
		synctest.Wait()
		time.Sleep(6 * time.Millisecond) // the cut's sleep (the row lock) ends: the admission comes back
		synctest.Wait()
		cut := r.Limit("p")
		require.Less(t, cut, 10)
		// Room under the cut cap, locally: the waiter's next call fails, and
		// it is admitted under the local registry.
		for _, h := range held[5:] {
			h.Release()
		}
		held = held[:5]
		sl := <-got
		require.NotNil(t, sl)
		require.True(t, sl.Degraded())
		before := r.Learned("p")
		r.Report(sl, upstream.Verdict{Kind: upstream.Admitted})
		after := r.Learned("p")
		assert.Equal(t, before.Cap, after.Cap, "a report on a Slot admitted outside the store moved the cap (by the given-back start's count)")
		sl.Release()
		for _, h := range held {
			h.Release()
		}
	})
}

// A waiter granted, whose claim is admitted at a count over a cut made
// while the claim was on its way, is given back by the store and waits
// again past the queue's bound (slots.WithMaxQueue), as the store's own
// give-back of a grant claimed under a lowered limit does: it does not fail
// with ErrQueueFull, having been at the head of the queue.
func TestGivenBackClaimWaitsPastTheQueueBound(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		mem := memstore.New()
		s := &faultyCutStore{cutMidCall: cutMidCall{Store: mem}}
		r := learnsTen(t, New[string](s, 100, WithLogger(quiet()), WithLocalOptions(slots.WithMaxQueue(1))))
		held := holdSpaced(t, r, 10)
		got := acquireThenRelease(r, "p")
		synctest.Wait() // queued in the store
		other := func(id string) {
			res, err := mem.AdmitOne(context.Background(), &driver.AdmitCall{
				Lease: id, Keys: []string{"p"}, Limits: []int{10}, Units: 1,
				TTL: 10 * time.Second, Wait: true, Claim: time.Second, Live: 5 * time.Second,
				Weight: 1, Proc: "other", MaxQueue: -1, MaxFlowQueue: -1,
			})
			require.NoError(t, err)
			require.Equal(t, driver.StatusQueued, res.Status)
		}
		// The claim's call meets the cut on its way; two waiters of another
		// process queue behind it meanwhile.
		s.cut = func() {
			r.Report(held[8], upstream.Verdict{Kind: upstream.Concurrency})
			other("o1")
			other("o2")
		}
		s.armed.Store(true)
		held[9].Release() // grants the waiter
		synctest.Wait()
		require.False(t, s.armed.Load(), "the claim met the cut")
		time.Sleep(time.Second) // its backoff
		synctest.Wait()
		returned := false
		select {
		case err := <-got:
			assert.NoError(t, err, "the waiter, granted at the head of the queue, failed after its claim was given back")
			returned = true
		default: // still waiting, as after the store's own give-back
		}
		for _, h := range held[:9] {
			h.Release()
		}
		if !returned {
			require.NoError(t, <-got, "admitted once the holders left")
		}
	})
}

// learnsTen has r learn "p" from a cap of 10, its most, closes r at the
// end of t, and returns it once its state is read.
func learnsTen(t *testing.T, r *Registry[string]) *Registry[string] {
	t.Cleanup(r.Close)
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 10, Max: 10}))
	synctest.Wait()
	return r
}

// acquireThenRelease acquires key on r in a goroutine of its own,
// releases what it got at once, and sends Acquire's error.
func acquireThenRelease(r *Registry[string], key string) <-chan error {
	got := make(chan error, 1)
	go func() {
		sl, err := r.Acquire(context.Background(), key)
		if err == nil {
			sl.Release()
		}
		got <- err
	}()
	return got
}

// releasedAll releases held and checks that the store counts nothing on
// "p" once the releases have reached it (what says why, if not).
func releasedAll(t *testing.T, r *Registry[string], held []*slots.Slot, what string) {
	t.Helper()
	for _, h := range held {
		h.Release()
	}
	synctest.Wait() // the releases reach the store
	n, err := r.InFlight(context.Background(), "p")
	require.NoError(t, err)
	assert.Zero(t, n, what)
}

// holdSpaced takes n slots of "p", a millisecond apart (each its own start).
func holdSpaced(t *testing.T, r *Registry[string], n int) []*slots.Slot {
	var held []*slots.Slot
	for range n {
		time.Sleep(time.Millisecond)
		held = append(held, holdP(t, 1, r)...)
	}
	return held
}

// The caller's context ends after the first call's admission over the
// cut came back, before the call made again is sent: that call is never
// sent, and the lease the first call put in the store is taken back (not
// left there, unrenewed, until the lease TTL).
func TestOverACutCtxEndsBetweenTheCalls(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		s := &cutMidCall{Store: memstore.New()}
		r := learnsTen(t, New[string](s, 100, WithLogger(quiet())))
		held := holdSpaced(t, r, 9)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s.cut = func() { r.Report(held[8], upstream.Verdict{Kind: upstream.Concurrency}) }
		s.after = cancel
		s.armed.Store(true)
		_, err := r.Acquire(ctx, "p")
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, r.Limit("p"), 10, "the cap was cut mid-call")
		releasedAll(t, r, held, "the lease admitted by the first call is taken back")
	})
}

// A cut below the lease's units: the call made again fails before
// anything is sent (ErrExceedsLimit), and the lease the first call put in
// the store is taken back.
func TestOverACutBelowTheUnits(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		s := &cutMidCall{Store: memstore.New()}
		r := learnsTen(t, New[string](s, 100, WithLogger(quiet())))
		held := holdSpaced(t, r, 4)
		s.cut = func() { r.Report(held[3], upstream.Verdict{Kind: upstream.Concurrency}) }
		s.armed.Store(true)
		_, err := r.TryAcquireN("p", 6) // sent with limit 10: admitted at 10
		require.Less(t, r.Limit("p"), 6, "the cap was cut below the units")
		require.ErrorIs(t, err, slots.ErrExceedsLimit)
		releasedAll(t, r, held, "the 6-unit lease admitted by the first call is taken back")
	})
}

// The breaker opens between the two calls (other calls failed meanwhile):
// the call made again is not made, unavailable answers (FailClosed), and
// the lease the first call put in the store is taken back once the store
// answers again.
func TestOverACutBreakerOpenBetweenTheCalls(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		s := &cutMidCall{Store: memstore.New()}
		var openNext atomic.Bool
		var r *Registry[string]
		r = NewWithKeys[string](s, 100, Keys[string]{Limit: func(string) int {
			if openNext.CompareAndSwap(true, false) {
				r.brk.isOpen.Store(true) // stands for failures of other calls meanwhile
			}
			return 100
		}}, WithLogger(quiet()), WithUnavailable(FailClosed))
		learnsTen(t, r)
		held := holdSpaced(t, r, 9)
		s.cut = func() { r.Report(held[8], upstream.Verdict{Kind: upstream.Concurrency}) }
		s.after = func() {
			synctest.Wait() // the learner's LimitFunc calls are done
			openNext.Store(true)
		}
		s.armed.Store(true)
		_, err := r.TryAcquire("p")
		require.ErrorIs(t, err, ErrUnavailable)
		require.Less(t, r.Limit("p"), 10)
		// The store answers again: the releaser sends what it kept.
		r.brk.success()
		r.recovered()
		releasedAll(t, r, held, "the lease the first call put in the store is taken back")
	})
}

// cutThenQueue is a store whose armed AdmitOne runs cut before the call
// and after once the store has answered; a pipeline with a call on "q"
// waits for release; the abandon of the armed call's lease id runs
// onAbandon.
type cutThenQueue struct {
	driver.Store
	armed      atomic.Bool
	cut, after func()
	firstID    atomic.Pointer[string]
	release    chan struct{}
	onAbandon  func()
	once       sync.Once
}

func (s *cutThenQueue) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if !s.armed.CompareAndSwap(true, false) {
		return s.Store.AdmitOne(ctx, c)
	}
	id := c.Lease
	s.firstID.Store(&id)
	s.cut()
	res, err := s.Store.AdmitOne(ctx, c)
	s.after()
	return res, err
}

func (s *cutThenQueue) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	if slices.ContainsFunc(calls, func(c *driver.AdmitCall) bool { return slices.Contains(c.Keys, "q") }) {
		<-s.release
	}
	return s.Store.Admit(ctx, calls)
}

func (s *cutThenQueue) Abandon(ctx context.Context, calls []*driver.AbandonCall) ([]error, error) {
	if id := s.firstID.Load(); id != nil {
		for _, c := range calls {
			if c.Lease == *id {
				s.once.Do(s.onAbandon)
			}
		}
	}
	return s.Store.Abandon(ctx, calls)
}

// The call made again over a cut, queued for a pipeline and not sent in
// time (as one the breaker stops in the queue): the first call's lease is
// taken back before the caller is admitted under the local registry
// (FallbackLocal), not after, when the held lease's id is read by the
// releaser, the heartbeat and other admissions' carries (under -race, a
// race of the id's write with the releaser's read).
func TestOverACutQueueTimeoutTakesBackBeforeHold(t *testing.T) {
	testrig.Bubble(t, queueTimeoutOverACut)
}

func queueTimeoutOverACut(t *testing.T) {
	ms := memstore.New()
	s := &cutThenQueue{Store: ms, release: make(chan struct{})}
	r := New[string](s, 100, WithLogger(quiet()), WithTimeout(100*time.Millisecond))
	t.Cleanup(r.Close)
	r.calls.max = 1
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 10, Max: 10}))
	r2 := New[string](ms, 100, WithLogger(quiet()))
	t.Cleanup(r2.Close)
	synctest.Wait()
	held2 := holdSpaced(t, r2, 8)
	time.Sleep(time.Millisecond) // virtual: the ninth start its own
	h, err := r.TryAcquire("p")  // the ninth start
	require.NoError(t, err)

	s.cut = func() { r.Report(h, upstream.Verdict{Kind: upstream.Concurrency}) }
	blocker := make(chan error, 1)
	s.after = func() {
		go func() {
			sl, err := r.TryAcquire("q")
			if err == nil {
				sl.Release()
			}
			blocker <- err
		}()
		synctest.Wait()
		require.Equal(t, 1, r.queued(), "the blocker's call queues")
	}
	abandoned := make(chan []string, 1)
	s.onAbandon = func() {
		// The releaser, sending the takeBack's abandon: what does this
		// process hold as degraded leases now?
		r.mu.Lock()
		var ids []string
		for d := range r.held.degraded {
			ids = append(ids, d.id)
		}
		r.mu.Unlock()
		abandoned <- ids
	}
	s.armed.Store(true)
	sl, err := r.TryAcquire("p")
	require.NoError(t, err)
	assert.True(t, sl.Degraded(), "the call made again timed out in the queue: FallbackLocal")
	// Nothing that locks r.mu here before the releaser has read: that
	// would order the write of l.id before its read.
	select {
	case ids := <-abandoned:
		assert.NotContains(t, ids, *s.firstID.Load(), "a held lease under the id being abandoned")
	case <-time.After(5 * time.Second):
		t.Fatal("the first call's lease was never taken back")
	}
	assert.Less(t, r.Limit("p"), 10, "the cap was cut mid-call")
	close(s.release)
	<-blocker
	sl.Release()
	h.Release()
	for _, x := range held2 {
		x.Release()
	}
}

// A second cut that comes while the call made again is on its way (the
// store admits it, and the cap now stands below its count) refuses the
// caller as a full key refuses it, with a Retry-After estimated from the
// key's holds (here a few milliseconds each), not a fixed second; and the
// lease goes back to the store.
func TestSecondCutMeanwhileRetryAfterIsEstimated(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		s := &cutMidCall{Store: memstore.New()}
		r := learnsTen(t, New[string](s, 100, WithLogger(quiet())))
		held := holdSpaced(t, r, 9)
		s.cut = func() { r.Report(held[8], upstream.Verdict{Kind: upstream.Concurrency}) }
		s.after = func() {
			// Between the two calls: four holds end, after a pause a
			// start is admitted (the cap leaves one start at a time), and
			// another is taken; the call made again is admitted at 8 of 8,
			// and that other start's refusal cuts the cap below it.
			releasedSome(held[:4])
			time.Sleep(2 * time.Second)
			x := holdP(t, 1, r)[0]
			r.Report(x, upstream.Verdict{Kind: upstream.Admitted})
			y := holdP(t, 1, r)[0]
			held = append(held[4:], x, y)
			s.cut = func() {}
			s.after = func() { r.Report(y, upstream.Verdict{Kind: upstream.Concurrency}) }
			s.armed.Store(true)
		}
		s.armed.Store(true)
		_, err := r.TryAcquire("p")
		var le *slots.LimitError
		require.True(t, errors.As(err, &le), "admitted over a second cut: %v", err)
		require.False(t, s.armed.Load(), "the second cut came during the call made again")
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		assert.Equal(t, len(held), le.InFlight)
		assert.Positive(t, le.RetryAfter)
		assert.Less(t, le.RetryAfter, 100*time.Millisecond, "from holds of a few milliseconds")
		// The next refusal on the key, the store's own, is told from the
		// same holds, behind the return told first.
		_, err = r.TryAcquire("p")
		var next *slots.LimitError
		require.True(t, errors.As(err, &next), "admitted over the cut: %v", err)
		assert.GreaterOrEqual(t, next.RetryAfter, le.RetryAfter)
		assert.Less(t, next.RetryAfter, 100*time.Millisecond)
		t.Logf("Retry-After %v, then %v", le.RetryAfter, next.RetryAfter)
		releasedAll(t, r, held, "the lease given back left the store")
	})
}

// releasedSome releases held and waits for the releases to reach the store.
func releasedSome(held []*slots.Slot) {
	for _, h := range held {
		h.Release()
	}
	synctest.Wait()
}
