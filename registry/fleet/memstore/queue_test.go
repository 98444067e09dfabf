package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// The queue's rules the suite does not reach, call by call on a clock that
// stands still, as the Redis and PostgreSQL stores keep them.

var still = func() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) }

// call is an admission of id on "k" under limit, by process "p".
func call(id string, limit int, wait bool, flow string, weight int) *driver.AdmitCall {
	return &driver.AdmitCall{Lease: id, Keys: []string{"k"}, Limits: []int{limit}, TTL: time.Minute, Wait: wait,
		Claim: time.Second, Live: 5 * time.Second, Flow: flow, Weight: weight, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1}
}

func admit(t *testing.T, s *memstore.Store, c *driver.AdmitCall) driver.Status {
	t.Helper()
	r, err := s.AdmitOne(context.Background(), c)
	require.NoError(t, err)
	return r.Status
}

// grants releases "held" and then each grant in turn, and returns the
// order in which the waiters were granted (each claims and releases).
func grants(t *testing.T, s *memstore.Store, n int) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 64)
	l := listener{granted: got, listening: make(chan struct{}, 1)}
	go s.Listen(ctx, "p", l)
	<-l.listening
	var order []string
	next := "held"
	for range n {
		require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: time.Second, Pairs: []driver.Release{{Key: "k", Lease: next, Limit: 1}}}))
		next = <-got
		order = append(order, next)
	}
	return order
}

type listener struct {
	granted   chan string
	listening chan struct{}
}

func (l listener) Listening() {
	select {
	case l.listening <- struct{}{}:
	default:
	}
}
func (l listener) Granted(id string) { l.granted <- id }
func (l listener) Learned(string)    {}

// A waiter of one key is served under the limit of the call that serves,
// not the one it queued under: a newcomer under a raised limit does not
// pass it.
func TestOneKeyWaiterTakesTheRaisedLimit(t *testing.T) {
	s := memstore.NewWithClock(still)
	require.Equal(t, driver.StatusAdmitted, admit(t, s, call("held", 1, false, "", 1)))
	require.Equal(t, driver.StatusQueued, admit(t, s, call("w", 1, true, "", 1)))
	assert.Equal(t, driver.StatusFull, admit(t, s, call("new", 2, false, "", 1)), "the waiter is served first")
	assert.Equal(t, driver.StatusAdmitted, admit(t, s, call("w", 2, true, "", 1)), "its grant, claimed")
}

// Start tags go to the microunit: ten turns of a flow of weight 10 meet
// one of weight 1 at 1, and go by arrival there.
func TestTagsMeetByArrival(t *testing.T) {
	s := memstore.NewWithClock(still)
	require.Equal(t, driver.StatusAdmitted, admit(t, s, call("held", 1, false, "", 1)))
	var want []string
	for _, id := range []string{"B1", "B2"} {
		require.Equal(t, driver.StatusQueued, admit(t, s, call(id, 1, true, "B", 1)))
	}
	for i := 1; i <= 11; i++ {
		require.Equal(t, driver.StatusQueued, admit(t, s, call(fmt.Sprint("A", i), 1, true, "A", 10)))
	}
	want = append(want, "B1")
	for i := 1; i <= 10; i++ {
		want = append(want, fmt.Sprint("A", i))
	}
	want = append(want, "B2", "A11")
	assert.Equal(t, want, grants(t, s, 13))
}

// A flow whose waiters all leave ungranted is charged nothing for them.
func TestLeaversAreNotCharged(t *testing.T) {
	s := memstore.NewWithClock(still)
	require.Equal(t, driver.StatusAdmitted, admit(t, s, call("held", 1, false, "", 1)))
	require.Equal(t, driver.StatusQueued, admit(t, s, call("B1", 1, true, "B", 1)))
	for i := 1; i <= 5; i++ {
		require.Equal(t, driver.StatusQueued, admit(t, s, call(fmt.Sprint("A", i), 1, true, "A", 1)))
	}
	for i := 1; i <= 5; i++ {
		_, err := s.Abandon(context.Background(), []*driver.AbandonCall{{Lease: fmt.Sprint("A", i), Keys: []string{"k"}, TTL: time.Minute}})
		require.NoError(t, err)
	}
	for _, id := range []string{"B2", "B3"} {
		require.Equal(t, driver.StatusQueued, admit(t, s, call(id, 1, true, "B", 1)))
	}
	require.Equal(t, driver.StatusQueued, admit(t, s, call("A6", 1, true, "A", 1)))
	assert.Equal(t, []string{"B1", "A6", "B2", "B3"}, grants(t, s, 4))
}

// A loss makes a new epoch, also on a clock that stands still.
func TestEpochAfterALossOnAStillClock(t *testing.T) {
	s := memstore.NewWithClock(still)
	r, err := s.AdmitOne(context.Background(), call("a", 1, false, "", 1))
	require.NoError(t, err)
	s.Lose()
	r2, err := s.AdmitOne(context.Background(), call("b", 1, false, "", 1))
	require.NoError(t, err)
	assert.Greater(t, r2.Epoch, r.Epoch)
}

// At driver.MaxTag, finish tags stop moving, so several waiters of a flow
// share one: the first waiter to reach it leaving gives no turn back, and
// the flow's waiters keep their order (a later one does not take the
// leaver's tag and pass those before it).
func TestFlowOrderAtMaxTag(t *testing.T) {
	s := memstore.NewWithClock(still)
	require.Equal(t, driver.StatusAdmitted, admit(t, s, call("held", 1, false, "", 1)))
	s.SetVirtualTime("k", 0, driver.MaxTag-2.5) // the class of call, 0
	// Tags: A1 MaxTag-2.5, A2 -1.5, A3 -0.5, A4 and A5 MaxTag; A3 is the
	// first whose finish is MaxTag.
	for i := 1; i <= 5; i++ {
		require.Equal(t, driver.StatusQueued, admit(t, s, call(fmt.Sprint("A", i), 1, true, "A", 1)))
	}
	_, err := s.Abandon(context.Background(), []*driver.AbandonCall{{Lease: "A3", Keys: []string{"k"}, TTL: time.Minute}})
	require.NoError(t, err)
	require.Equal(t, driver.StatusQueued, admit(t, s, call("A6", 1, true, "A", 1)))
	assert.Equal(t, []string{"A1", "A2", "A4", "A5", "A6"}, grants(t, s, 5))
}

// Turns count units in steps of a key's limit/driver.TurnSteps, rounded
// up: a waiter of a single unit costs a turn of 1 whatever the limit, one
// of the whole limit at most TurnSteps.
func TestTurnCost(t *testing.T) {
	for _, tc := range []struct{ units, limit, cost int }{
		{1, 1, 1}, {3, 3, 3}, {1, 3000, 1}, {2000, 3000, 667}, {2002, 3000, 668}, {3000, 3000, 1000},
		{999, 999, 999}, {1999, 1999, 1999}, {2000, 2000, 1000}, {1_000_000, 1_000_000, 1000}, {1_000, 1_000_000, 1}, {1_001, 1_000_000, 2}, {5, 1 << 62, 1}, {0, 10, 1},
	} {
		assert.Equal(t, tc.cost, driver.TurnCost(tc.units, tc.limit), "%d units of %d", tc.units, tc.limit)
	}
}

// A ticket of several keys costs each key's turn by that key's limit: 3
// units are 3 steps of a key of 3, and 1 of a key of 3,000.
func TestTurnCostPerKey(t *testing.T) {
	s := memstore.NewWithClock(still)
	held := call("held", 3, false, "", 1)
	held.Units = 3
	require.Equal(t, driver.StatusAdmitted, admit(t, s, held))
	c := call("A1", 3, true, "A", 1)
	c.Keys, c.Limits, c.Units = []string{"k", "j"}, []int{3, 3000}, 3
	require.Equal(t, driver.StatusQueued, admit(t, s, c))
	assert.Equal(t, 3.0, s.Finish("k", 0, "A"))
	assert.Equal(t, 1.0, s.Finish("j", 0, "A"))
}

// A grant under a claim window of 0 to a waiter whose liveness is 1 ms
// (the fleet's client sends at least 10 ms and 3 claim windows; a store's
// own caller may not) is made for a millisecond, and the waiter lives 3
// (driver.Millis, AdmitCall.LiveMillis), as on Redis and PostgreSQL: the
// grant outlives the serving that made it, and the waiter is not taken
// for dead there.
func TestGrantUnderAClaimOfNoTimeCounts(t *testing.T) {
	s := memstore.NewWithClock(still)
	require.Equal(t, driver.StatusAdmitted, admit(t, s, call("held", 1, false, "", 1)))
	for _, id := range []string{"w", "x"} {
		c := call(id, 1, true, "", 1)
		c.Claim, c.Live = 0, time.Millisecond
		require.Equal(t, driver.StatusQueued, admit(t, s, c))
	}
	require.NoError(t, s.Release(context.Background(), &driver.ReleaseCall{Claim: 0, Pairs: []driver.Release{{Key: "k", Lease: "held", Limit: 1}}}))
	n, err := s.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "w's grant")
	assert.Equal(t, driver.StatusFull, admit(t, s, call("new", 1, false, "", 1)), "w's grant holds the room")
}

// A learned state written for less than a millisecond is kept for one
// (driver.Millis), as on Redis and PostgreSQL: read back on a clock that
// stands still, where it had expired as it was written.
func TestLearnedStateForUnderAMillisecond(t *testing.T) {
	s := memstore.NewWithClock(still)
	ctx := context.Background()
	w, err := s.SyncLearned(ctx, &driver.LearnedCall{Key: "c", Presumed: "-", State: `{"v":1}`, TTL: 500 * time.Microsecond})
	require.NoError(t, err)
	require.True(t, w.Wrote)
	r, err := s.SyncLearned(ctx, &driver.LearnedCall{Key: "c", TTL: 500 * time.Microsecond})
	require.NoError(t, err)
	assert.True(t, r.Found)
	assert.Equal(t, "1", r.Version)
}
