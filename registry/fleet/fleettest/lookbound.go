package fleettest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// The cases of a serving that stops at its look bound (driver.PassScan
// waiters) with room left, and goes on past it: a newcomer's look
// further, a release of several pairs on the key.

// As SeveralKeysWaiterTurnsHeavy, with the waiters of several keys before
// the look bound of a serving (driver.PassScan waiters from the head) and
// the light waiters past it: a serving that goes on past the bound (a
// newcomer's look further, a release of several pairs on the key) knows
// the waiters of several keys before where it goes on, as a serving from
// the head does. H holds 7 units of 10 on a; PassScan waiters W (3 units)
// wait on a and b, passed over for want of room on b (G holds it), then
// L1 and L2 (1 unit) on a alone. Once L1 is granted (by the serving that
// looks further, or by one without a look bound), W's 3 units have no
// room on a: they keep the 2 left, from L2 and from a newcomer.
func severalKeysWaiterBeforeTheLookBound(t *testing.T, srv Server) {
	const lim = 10
	setUp := func(h storeCall, held ...int) {
		t.Helper()
		require.Equal(t, driver.StatusAdmitted, h.admit("G", "b", 1, 1, 0, "f", false).Status)
		for i, u := range held {
			require.Equal(t, driver.StatusAdmitted, h.admit(fmt.Sprintf("H%d", i), "a", u, lim, 0, "f", false).Status)
		}
		for i := range driver.PassScan {
			r := h.admitKeys(fmt.Sprintf("W%d", i), []string{"a", "b"}, 3, []int{lim, 1}, 0, true)
			require.Equal(t, driver.StatusQueued, r.Status, "W%d: %+v", i, r)
		}
		for _, l := range []string{"L1", "L2"} {
			require.Equal(t, driver.StatusQueued, h.admit(l, "a", 1, lim, 0, "f", true).Status, "%s", l)
		}
	}
	t.Run("Newcomer", func(t *testing.T) {
		h := storeCall{t, srv.Store(t, "severalKeysWaiterBeforeTheLookBound/newcomer")}
		setUp(h, 7, 3)
		h.release("H1", "a", lim) // 3 units free: the Ws cannot take them (b is full)
		r := h.admit("N", "a", 1, lim, 0, "f", false)
		assert.Equal(t, driver.StatusFull, r.Status, "a newcomer took the room W0 (heavy on a once L1 was granted) waits for: %+v", r)
		require.Equal(t, 8, h.count("a"), "H's 7 units and L1's grant: more went past W0, heavy on a, a waiter of several keys")
	})
	t.Run("BatchRelease", func(t *testing.T) {
		h := storeCall{t, srv.Store(t, "severalKeysWaiterBeforeTheLookBound/batch")}
		setUp(h, 7, 2, 1)
		// One call releases H1 and H2: serving a may go on past its look
		// bound, once per pair.
		require.NoError(t, h.s.Release(context.Background(), &driver.ReleaseCall{TTL: time.Hour, Claim: time.Minute,
			Pairs: []driver.Release{{Key: "a", Lease: leaseID("H1"), Limit: lim}, {Key: "a", Lease: leaseID("H2"), Limit: lim}}}))
		require.LessOrEqual(t, h.count("a"), 8, "grants went past W0, heavy on a, a waiter of several keys")
		r := h.admit("L2", "a", 1, lim, 0, "f", true)
		require.Equal(t, driver.StatusQueued, r.Status, "L2's own call took the room W0 waits for: %+v", r)
		require.LessOrEqual(t, h.count("a"), 8)
	})
}

// As SeveralKeysWaiterBeforeTheLookBound, with the heavy waiter of several
// keys not looked at by the serving that stopped at its bound: it was the
// first waiter past the bound, and a waiter before it (X, of a and b) was
// granted through b's serving before the newcomer's look further on a, so
// that it stands before where that look goes on. a: P holds 7 of 10; X
// (1 unit, a and b) waits, held up on b by Hb (2 units of b under its own
// limit of 2, before X there: heavy by its own limit); 63 waiters F (1
// unit, a and c) wait for c; W (3 units, a and c) waits for c; then L1 and
// L2 (1 unit, a). Q's 3 units leave a: serving a looks at X and the Fs,
// and stops at its bound. A newcomer N of a and b (limit 10 on b) serves
// a (as the release did), then b, whose serving grants X (Hb is not heavy
// under 10): a has 8, and W's 3 units have no room on a. W, the first
// waiter the look further on a goes on from, keeps the room: L2 (and N)
// do not take it (memstore, looking from the head, grants X, stops at W).
func severalKeysWaiterSlidBeforeTheLookBound(t *testing.T, srv Server) {
	const lim = 10
	h := storeCall{t, srv.Store(t, "severalKeysWaiterSlidBeforeTheLookBound")}
	queueBehindX(h, lim)
	require.Equal(t, driver.StatusQueued, h.admitKeys("W", []string{"a", "c"}, 3, []int{lim, 1}, 0, true).Status)
	for _, l := range []string{"L1", "L2"} {
		require.Equal(t, driver.StatusQueued, h.admit(l, "a", 1, lim, 0, "f", true).Status, "%s", l)
	}
	h.release("Q", "a", lim)
	r := h.admitKeys("N", []string{"a", "b"}, 1, []int{lim, lim}, 0, false)
	assert.Equal(t, driver.StatusFull, r.Status, "%+v", r)
	assert.LessOrEqual(t, h.count("a"), 9, "grants went past W, heavy on a once X was granted, a waiter of several keys")
	r = h.admit("L2", "a", 1, lim, 0, "f", true)
	assert.Equal(t, driver.StatusQueued, r.Status, "L2 was granted past W, heavy on a: %+v", r)
}

// queueBehindX makes the queue of SeveralKeysWaiterSlidBeforeTheLookBound
// up to the Fs: a full (P 7 units, Q 3, of lim), X waiting on a and b
// behind Hb, and PassScan-1 waiters F of a and c behind Gc.
func queueBehindX(h storeCall, lim int) {
	h.t.Helper()
	require.Equal(h.t, driver.StatusAdmitted, h.admit("Gb", "b", 1, lim, 0, "f", false).Status)
	require.Equal(h.t, driver.StatusAdmitted, h.admit("Gc", "c", 1, 1, 0, "f", false).Status)
	require.Equal(h.t, driver.StatusAdmitted, h.admit("P", "a", 7, lim, 0, "f", false).Status)
	require.Equal(h.t, driver.StatusAdmitted, h.admit("Q", "a", 3, lim, 0, "f", false).Status)
	require.Equal(h.t, driver.StatusQueued, h.admitKeys("Hb", []string{"b", "d"}, 2, []int{2, lim}, 0, true).Status)
	require.Equal(h.t, driver.StatusQueued, h.admitKeys("X", []string{"a", "b"}, 1, []int{lim, lim}, 0, true).Status)
	for i := range driver.PassScan - 1 {
		r := h.admitKeys(fmt.Sprintf("F%d", i), []string{"a", "c"}, 1, []int{lim, 1}, 0, true)
		require.Equal(h.t, driver.StatusQueued, r.Status, "F%d: %+v", i, r)
	}
}

// As SeveralKeysWaiterSlidBeforeTheLookBound, with a light waiter of one
// key (V, 1 unit) the first past the bound: once X, before the bound, is
// granted through b's serving, V stands before where the look further on
// a goes on, and is served there before L (1 unit, behind it), and before
// the newcomer N. a: P holds 7 of 10, Q 3; X (a and b) is held up on b by
// Hb, PassScan-1 waiters F (a and c) wait for c. Q leaves; N (a and b)
// serves a (stopped at its bound), then b (X granted: a has 8), then
// looks further on a: V and L take the 2 units left, N finds a full.
func lightWaiterSlidBeforeTheLookBound(t *testing.T, srv Server) {
	const lim = 10
	h := storeCall{t, srv.Store(t, "lightWaiterSlidBeforeTheLookBound")}
	queueBehindX(h, lim)
	for _, l := range []string{"V", "L"} {
		require.Equal(t, driver.StatusQueued, h.admit(l, "a", 1, lim, 0, "f", true).Status, "%s", l)
	}
	h.release("Q", "a", lim)
	r := h.admitKeys("N", []string{"a", "b"}, 1, []int{lim, lim}, 0, false)
	assert.Equal(t, driver.StatusFull, r.Status, "N took the room of V, a waiter before it that the look further skipped: %+v", r)
	assert.Equal(t, lim, h.count("a"), "X, V and L granted")
}

// UrgentPastTheLookBound checks, for a store that keeps a place for a
// waiter of several keys passed over registry.MaxPassed times (the Redis
// and PostgreSQL stores; memstore keeps none, so it is not in Run), that
// the grants of a serving that goes on past its look bound (a release of
// several pairs on a key) pass the waiters before where it goes on, as
// grants from the head do.
//
// a (limit 10) is full: P and nine H of 1 unit. W and then PassScan-1
// waiters F, of a and c, wait for c (Gc holds it, limit 1); ten light
// waiters L of a wait behind them. One call releases the nine H: serving
// a stops at its look bound, then goes on; its MaxPassed-th grant makes W
// urgent, and a keeps W's place from the L after it. Gc leaves: W is
// granted on both keys, and a newcomer of c finds it full.
func UrgentPastTheLookBound(t *testing.T, s driver.Store) {
	const lim = 10
	require.Less(t, registry.MaxPassed, lim-1, "the nine H's release grants MaxPassed L and more")
	h := storeCall{t, s}
	require.Equal(t, driver.StatusAdmitted, h.admit("Gc", "c", 1, 1, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("P", "a", 1, lim, 0, "f", false).Status)
	var pairs []driver.Release
	for i := range lim - 1 {
		require.Equal(t, driver.StatusAdmitted, h.admit(fmt.Sprint("H", i), "a", 1, lim, 0, "f", false).Status)
		pairs = append(pairs, driver.Release{Key: "a", Lease: leaseID(fmt.Sprint("H", i)), Limit: lim})
	}
	require.Equal(t, driver.StatusQueued, h.admitKeys("W", []string{"a", "c"}, 1, []int{lim, 1}, 0, true).Status)
	for i := range driver.PassScan - 1 {
		r := h.admitKeys(fmt.Sprintf("F%d", i), []string{"a", "c"}, 1, []int{lim, 1}, 0, true)
		require.Equal(t, driver.StatusQueued, r.Status, "F%d: %+v", i, r)
	}
	for i := range lim {
		require.Equal(t, driver.StatusQueued, h.admit(fmt.Sprint("L", i), "a", 1, lim, 0, "f", true).Status, "L%d", i)
	}
	require.NoError(t, s.Release(context.Background(), &driver.ReleaseCall{TTL: time.Hour, Claim: time.Minute, Pairs: pairs}))
	assert.Equal(t, 1+registry.MaxPassed, h.count("a"),
		"P and MaxPassed L; then W, passed by as many grants, is urgent and keeps a place on a")
	h.release("Gc", "c", 1)
	assert.Equal(t, 2+registry.MaxPassed, h.count("a"), "W granted on a")
	assert.Equal(t, 1, h.count("c"), "W granted on c")
	r := h.admit("N", "c", 1, 1, 0, "f", false)
	assert.Equal(t, driver.StatusFull, r.Status, "a newcomer took W's place on c: %+v", r)
}
