package fleettest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// The fleet-wide order: classes, the flows' weighted turns, arrival, and
// no newcomer passing a waiter that could take the room. The tests that
// assert an order of admissions run on patientProcesses: a claim late on
// a busy machine loses its grant, by the protocol, and would change the
// order the store granted in.

// Interactive waiters go before batch ones queued earlier, across
// processes: each waiter starts once the one before it stands in the
// store's queue, and the holder lets go once all four do.
func classOrder(t *testing.T, srv Server) {
	rs := patientProcesses(t, srv, "class", 2, 1, fleet.WithTimeout(slowCalls))
	s, err := rs[0].TryAcquire("k")
	require.NoError(t, err)
	adm := newAdmissions(t)
	batch := func(ctx context.Context) context.Context { return slots.WithPriority(ctx, slots.PriorityBatch) }
	for i := range 3 {
		adm.wait(batch, rs[1], "batch")
		queuedIs(t, srv, "class", "k", i+1)
	}
	adm.wait(func(ctx context.Context) context.Context { return slots.WithPriority(ctx, slots.PriorityInteractive) }, rs[0], "interactive")
	queuedIs(t, srv, "class", "k", 4)
	s.Release()
	assert.Equal(t, []string{"interactive", "batch", "batch", "batch"}, adm.done(t))
}

// Weighted turns, exactly: with one slot held, waiters of a flow of
// weight 3 (A) and one of weight 1 (B) queue alternately, A1 B1 A2 B2 ...,
// each once the one before it stands in the store's queue; the holder
// then lets go, and each waiter releases as soon as it is admitted. Start
// tags (A: 0, 1/3, 2/3, 1, ...; B: 0, 1, 2, ...), then arrival, give one
// order.
func weightedTurns(t *testing.T, srv Server) {
	rs := patientProcesses(t, srv, "turns", 2, 1, fleet.WithTimeout(slowCalls))
	held, err := rs[0].TryAcquire("k")
	require.NoError(t, err)
	adm := newAdmissions(t)
	flowA := flow("A", 3)
	flowB := flow("B", 1)
	for i := 1; i <= 6; i++ {
		adm.wait(flowA, rs[0], fmt.Sprint("A", i))
		queuedIs(t, srv, "turns", "k", 2*i-1)
		adm.wait(flowB, rs[1], fmt.Sprint("B", i))
		queuedIs(t, srv, "turns", "k", 2*i)
	}
	held.Release()
	assert.Equal(t, []string{"A1", "B1", "A2", "A3", "B2", "A4", "A5", "A6", "B3", "B4", "B5", "B6"}, adm.done(t))
}

// Flows' turns are counted in units (driver.TurnCost): a waiter moves its
// flow's next start tag on by its turn's cost per weight. With a limit of
// 3 held whole, a flow A of waiters of 3 units and a flow B of waiters of
// 2 units, both of weight 1, queue (A1..A4, then B1..B5); each waiter
// needs more than half the limit, so one is in at a time, and each
// releases as soon as it is admitted. Start tags (A: 0, 3, 6, 9; B: 0, 2,
// 4, 6, 8), then arrival, give one order: B is granted 5 waiters (10
// units) while A is granted 4 (12). Counted in waiters, they would
// alternate. On a key of 3,000, turns count steps of 3 units, rounded up:
// waiters of 3,000 and 1,999 cost 1,000 and 667, and give the same order
// (B4's tag is 2,001, after A3's 2,000; not rounded up, it would be
// 1,998, before it).
func turnsInUnits(t *testing.T, srv Server) {
	for _, tc := range []struct{ limit, a, b int }{{3, 3, 2}, {3000, 3000, 1999}} {
		t.Run(fmt.Sprint("limit ", tc.limit), func(t *testing.T) {
			name := fmt.Sprint("unitturns", tc.limit)
			rs := patientProcesses(t, srv, name, 2, tc.limit, fleet.WithTimeout(slowCalls))
			held, err := rs[0].TryAcquireN("k", tc.limit)
			require.NoError(t, err)
			adm := newAdmissions(t)
			for i := 1; i <= 4; i++ {
				adm.waitPlaced(flow("A", 1), rs[0], fmt.Sprint("A", i), tc.a, "k")
				queuedIs(t, srv, name, "k", i)
			}
			for i := 1; i <= 5; i++ {
				adm.waitPlaced(flow("B", 1), rs[1], fmt.Sprint("B", i), tc.b, "k")
				queuedIs(t, srv, name, "k", 4+i)
			}
			held.Release()
			assert.Equal(t, []string{"A1", "B1", "B2", "A2", "B3", "A3", "B4", "B5", "A4"}, adm.done(t))
		})
	}
}

// Turns that meet go by arrival: ten waiters of a flow of weight 10 (A)
// reach start tag 1 as the second waiter of a flow of weight 1 (B) does,
// which came first (the sum of ten tenths is not quite 1 in floating
// point: the stores compare tags to the microunit).
func turnsMeetByArrival(t *testing.T, srv Server) {
	rs := patientProcesses(t, srv, "meet", 2, 1, fleet.WithTimeout(slowCalls))
	held, err := rs[0].TryAcquire("k")
	require.NoError(t, err)
	adm := newAdmissions(t)
	flowA := flow("A", 10)
	flowB := flow("B", 1)
	want := []string{"B1"}
	for i, name := range []string{"B1", "B2"} {
		adm.wait(flowB, rs[1], name)
		queuedIs(t, srv, "meet", "k", i+1)
	}
	for i := 1; i <= 11; i++ {
		adm.wait(flowA, rs[0], fmt.Sprint("A", i))
		queuedIs(t, srv, "meet", "k", 2+i)
		if i <= 10 {
			want = append(want, fmt.Sprint("A", i))
		}
	}
	want = append(want, "B2", "A11")
	held.Release()
	assert.Equal(t, want, adm.done(t))
}

// A flow whose waiters all give up is charged nothing for their turns:
// after five waiters of A leave, A's next waiter goes before B's that
// queued after B's first.
func leaversAreNotCharged(t *testing.T, srv Server) {
	rs := patientProcesses(t, srv, "leave", 2, 1, fleet.WithTimeout(slowCalls))
	held, err := rs[0].TryAcquire("k")
	require.NoError(t, err)
	adm := newAdmissions(t)
	flowA := flow("A", 1)
	flowB := flow("B", 1)
	adm.wait(flowB, rs[1], "B1")
	queuedIs(t, srv, "leave", "k", 1)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 5)
	for i := range 5 {
		go func() {
			_, err := rs[0].Acquire(flowA(ctx), "k")
			left <- err
		}()
		queuedIs(t, srv, "leave", "k", 2+i)
	}
	cancel()
	for range 5 {
		require.ErrorIs(t, <-left, context.Canceled)
	}
	queuedIs(t, srv, "leave", "k", 1)
	for i, name := range []string{"B2", "B3"} {
		adm.wait(flowB, rs[1], name)
		queuedIs(t, srv, "leave", "k", 2+i)
	}
	adm.wait(flowA, rs[0], "A6")
	queuedIs(t, srv, "leave", "k", 4)
	held.Release()
	assert.Equal(t, []string{"B1", "A6", "B2", "B3"}, adm.done(t))
}

// A newcomer does not pass a waiter that the limit it brings lets in: with
// the key's limit raised from 1 to 2 while a waiter stands in the queue, a
// TryAcquire under the new limit serves the waiter first, and is refused.
func newcomerDoesNotPass(t *testing.T, srv Server) {
	holder, waiter, _ := heldAgainst(t, srv, "pass")
	s, err := holder.TryAcquire("k")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		w, err := waiter.Acquire(ctx, "k")
		if err == nil {
			defer w.Release()
		}
		got <- err
	}()
	queuedIs(t, srv, "pass", "k", 1)
	holder.SetLimit("k", 2)
	waiter.SetLimit("k", 2)
	_, err = holder.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the newcomer under the raised limit")
	require.NoError(t, <-got, "the waiter, served by the newcomer's call")
	s.Release()
}

// flow places a waiter's context in the flow name, of weight.
func flow(name string, weight int) func(context.Context) context.Context {
	return func(ctx context.Context) context.Context { return slots.WithFlowWeight(ctx, name, weight) }
}
