package fleettest

// The store's serving at the driver's level, as one process calls it:
// the bounds on passing a heavy waiter within one serving and for a
// newcomer, the order of removal and serving when a lease leaves several
// keys, a grant on every key made by its waiter's own call, the key a
// refusal names and the one a queued waiter's ask names, the room a raised
// limit makes served by an ask, a waiter its own ask's serving drops going
// on as a newcomer, and waiters of several keys named with odd bytes.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// storeCall makes the store's calls of one process, "p", failing t on an
// error.
type storeCall struct {
	t *testing.T
	s driver.Store
}

// leaseID is a lease id made of name, of the length the fleet's are.
func leaseID(name string) string { return fmt.Sprintf("%032x", name) }

// admit makes lease name's call on key k.
func (h storeCall) admit(name, k string, units, limit int, class uint8, flow string, wait bool) driver.AdmitResult {
	h.t.Helper()
	return h.call(name, []string{k}, units, []int{limit}, class, flow, wait)
}

// call makes lease name's call on keys, in flow.
func (h storeCall) call(name string, keys []string, units int, limits []int, class uint8, flow string, wait bool) driver.AdmitResult {
	h.t.Helper()
	r, err := h.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: leaseID(name), Keys: keys, Limits: limits,
		Units: units, TTL: time.Hour, Claim: time.Minute, Live: time.Hour, Wait: wait, Class: class, Flow: flow, Weight: 1,
		Proc: "p", MaxQueue: -1, MaxFlowQueue: -1})
	require.NoError(h.t, err)
	return r
}

// clientCalls makes lease calls as the fleet's client makes them: with
// the epoch the store last told and a pause (driver.AdmitCall step 2),
// so that a store's shortcuts for a waiter's ask run.
type clientCalls struct {
	t     *testing.T
	s     driver.Store
	epoch int64
}

// call makes lease name's call on keys.
func (c *clientCalls) call(name string, keys []string, units int, limits []int, wait bool) driver.AdmitResult {
	c.t.Helper()
	r, err := c.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: leaseID(name), Keys: keys, Limits: limits,
		Units: units, TTL: time.Hour, Claim: time.Minute, Live: time.Hour, Wait: wait, Weight: 1, Proc: "p",
		MaxQueue: -1, MaxFlowQueue: -1, Epoch: c.epoch, Pause: time.Hour})
	require.NoError(c.t, err)
	c.epoch = r.Epoch
	return r
}

func (h storeCall) release(name, k string, limit int) {
	h.t.Helper()
	h.releasePairs(driver.Release{Key: k, Lease: leaseID(name), Limit: limit})
}

func (h storeCall) count(k string) int {
	h.t.Helper()
	n, err := h.s.Count(context.Background(), k)
	require.NoError(h.t, err)
	return n
}

// admitKeys makes lease name's call on keys, in flow "f".
func (h storeCall) admitKeys(name string, keys []string, units int, limits []int, class uint8, wait bool) driver.AdmitResult {
	h.t.Helper()
	return h.call(name, keys, units, limits, class, "f", wait)
}

// A release that frees room for light waiters behind a heavy one grants
// them only until the units granted past it reach PassFactor times its
// own (driver.ReleaseCall): then serving stops there.
func passBoundWithinOneServing(t *testing.T, srv Server) {
	s := srv.Store(t, "passBoundWithinOneServing")
	h := storeCall{t, s}
	const lim = 10
	require.Equal(t, driver.StatusAdmitted, h.admit("H", "k", 7, lim, 0, "f0", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("F", "k", 3, lim, 0, "f0", false).Status)
	// B: 4 units, bound 4*4 = 16; each light waiter of another flow
	// counts 2*4 = 8 against it.
	require.Equal(t, driver.StatusQueued, h.admit("B", "k", 4, lim, 0, "f0", true).Status)
	for _, l := range []string{"L1", "L2", "L3"} {
		require.Equal(t, driver.StatusQueued, h.admit(l, "k", 1, lim, 0, "f1", true).Status)
	}
	h.release("F", "k", lim) // 3 units free: B (4) cannot take them
	// L1 (8 past B) and L2 (16: B's bound) are granted; L3 is not.
	require.Equal(t, 9, h.count("k"), "units held after the release: serving passed B past its bound")
}

// A newcomer does not pass a heavy waiter of one key that has been passed
// its bound, though the head of the queue (another heavy waiter, under
// its bound) would let it pass.
func newcomerDoesNotPassAtBound(t *testing.T, srv Server) {
	s := srv.Store(t, "newcomerDoesNotPassAtBound")
	h := storeCall{t, s}
	const lim = 4
	require.Equal(t, driver.StatusAdmitted, h.admit("H", "k", 3, lim, 0, "f0", false).Status)
	// B: 2 units, class 1, bound 8; a newcomer of another flow that
	// passes it counts 8: B is at its bound.
	require.Equal(t, driver.StatusQueued, h.admit("B", "k", 2, lim, 1, "f0", true).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("N1", "k", 1, lim, 1, "f1", true).Status)
	h.release("N1", "k", lim)
	// A: 3 units, class 0, at the head, under its bound.
	require.Equal(t, driver.StatusQueued, h.admit("A", "k", 3, lim, 0, "f0", true).Status)
	// C: 1 unit, class 1: it would pass B, at its bound.
	r := h.admit("C", "k", 1, lim, 1, "f1", true)
	require.Equal(t, driver.StatusQueued, r.Status, "a newcomer passed B, passed over its bound already")
}

// A waiter of several keys whose own call grants it room while serving
// its second key (the first key's serving stopped before it) is admitted
// (driver.AdmitCall steps 5 and 6): the grant is on every one of its
// keys, not a part of one to drop. (Processes with different limits: Y's
// has 5 for a and c, W's 3 for a and b, Z2's 2 for a.)
func ownCallGrantOnLaterKey(t *testing.T, srv Server) {
	s := srv.Store(t, "ownCallGrantOnLaterKey")
	h := storeCall{t, s}
	require.Equal(t, driver.StatusAdmitted, h.admit("Z2", "a", 1, 2, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("Z1", "a", 2, 5, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("C", "c", 5, 5, 0, "f", false).Status)
	// Y (2 units) waits on a and c: c is full.
	require.Equal(t, driver.StatusQueued, h.admitKeys("Y", []string{"a", "c"}, 2, []int{5, 5}, 0, true).Status)
	// W (1 unit) waits on a and b: a is full under W's 3.
	require.Equal(t, driver.StatusQueued, h.admitKeys("W", []string{"a", "b"}, 1, []int{3, 3}, 0, true).Status)
	// Z2 leaves; its release serves a under its 2: a holds 2.
	h.release("Z2", "a", 2)
	require.Equal(t, 2, h.count("a"))
	// W asks: serving a under W's 3 stops at Y (heavy there, of two
	// keys); serving b finds room for W on a and b (Y, by its own 5,
	// is not heavy on a) and grants it on both.
	r := h.admitKeys("W", []string{"a", "b"}, 1, []int{3, 3}, 0, true)
	require.Equal(t, driver.StatusAdmitted, r.Status, "W was granted by its own call's serving of b, then given back: %+v", r)
	require.Equal(t, 3, h.count("a"))
	require.Equal(t, 1, h.count("b"))
}

// An abandon of a lease on several keys serves their queues once the lease
// is gone from all of them (driver.AbandonCall: "then"): the head, a
// waiter of the same keys, takes the room, not a waiter behind it.
func abandonServesAfterRemovingAll(t *testing.T, srv Server) {
	s := srv.Store(t, "abandonServesAfterRemovingAll")
	h := storeCall{t, s}
	ab := []string{"a", "b"}
	require.Equal(t, driver.StatusAdmitted, h.admitKeys("L", ab, 1, []int{1, 1}, 0, false).Status)
	require.Equal(t, driver.StatusQueued, h.admitKeys("W", ab, 1, []int{1, 1}, 0, true).Status)
	require.Equal(t, driver.StatusQueued, h.admit("X", "a", 1, 1, 0, "f", true).Status)
	_, err := h.s.Abandon(context.Background(), []*driver.AbandonCall{{Lease: leaseID("L"), Keys: ab, Limits: []int{1, 1},
		TTL: time.Hour, Claim: time.Minute}})
	require.NoError(t, err)
	r := h.admitKeys("W", ab, 1, []int{1, 1}, 0, true)
	require.Equal(t, driver.StatusAdmitted, r.Status, "the head W was passed over: %+v", r)
	require.Equal(t, driver.StatusQueued, h.admit("X", "a", 1, 1, 0, "f", true).Status)
}

// A newcomer refused names its first key that refuses it: here the first
// is full, the second kept for a heavy waiter (memstore's firstFull).
func refusalNamesTheFirstKey(t *testing.T, srv Server) {
	s := srv.Store(t, "refusalNamesTheFirstKey")
	h := storeCall{t, s}
	require.Equal(t, driver.StatusAdmitted, h.admit("H", "a", 1, 1, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("G", "b", 1, 3, 0, "f", false).Status)
	// Y (3 units) waits on b and c: heavy on b.
	require.Equal(t, driver.StatusQueued, h.admitKeys("Y", []string{"b", "c"}, 3, []int{3, 3}, 0, true).Status)
	r := h.admitKeys("N", []string{"a", "b"}, 1, []int{1, 3}, 0, false)
	require.Equal(t, driver.StatusFull, r.Status)
	require.Equal(t, 0, r.Key, "the key named: %+v", r)
	require.EqualValues(t, 1, r.Count)
}

// A queued waiter that asks again names the key it waits on: the first
// of its keys without room for its units, or where serving stopped at a
// heavy waiter (memstore's firstFull), not one where serving only went
// past a heavy waiter behind it. W waits on a (room for it) and b (full);
// Y, heavy on a, waits behind it: W's ask names b, its count and queue.
func queuedNamesTheKeyItWaitsOn(t *testing.T, srv Server) {
	s := srv.Store(t, "queuedNamesTheKeyItWaitsOn")
	h := storeCall{t, s}
	require.Equal(t, driver.StatusAdmitted, h.admit("H", "a", 2, 3, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("G", "b", 1, 1, 0, "f", false).Status)
	r := h.admitKeys("W", []string{"a", "b"}, 1, []int{3, 1}, 0, true)
	require.Equal(t, driver.StatusQueued, r.Status)
	require.Equal(t, 1, r.Key, "a newcomer queued names b: %+v", r)
	require.Equal(t, driver.StatusQueued, h.admit("Y", "a", 2, 3, 0, "f", true).Status) // heavy: 1 unit free on a
	r = h.admitKeys("W", []string{"a", "b"}, 1, []int{3, 1}, 0, true)
	require.Equal(t, driver.StatusQueued, r.Status)
	require.Equal(t, 1, r.Key, "W waits on b, not on a (room for it; Y is behind it): %+v", r)
	require.EqualValues(t, 1, r.Count, "b's count")
	require.EqualValues(t, 1, r.Queue, "b's queue: W")
}

// As QueuedNamesTheKeyItWaitsOn, for an ask made as the fleet's client
// makes it (the epoch it saw, a pause), which a store may answer without
// serving (PostgreSQL does, while no key has room for the waiter): Y,
// heavy on a, waits before W this time; W's ask names b, where it has no
// room (serving goes past Y, a waiter of one key under its bound: a is not
// kept for it, though W, of two keys, does not pass it).
func queuedAskNamesTheKeyItWaitsOn(t *testing.T, srv Server) {
	c := &clientCalls{t: t, s: srv.Store(t, "queuedAskNamesTheKeyItWaitsOn")}
	call := func(name string, keys []string, units int, limits []int) driver.AdmitResult {
		t.Helper()
		return c.call(name, keys, units, limits, true)
	}
	require.Equal(t, driver.StatusAdmitted, call("H", []string{"a"}, 2, []int{3}).Status)
	require.Equal(t, driver.StatusAdmitted, call("G", []string{"b"}, 1, []int{1}).Status)
	require.Equal(t, driver.StatusQueued, call("Y", []string{"a"}, 2, []int{3}).Status) // heavy: 1 unit free on a
	require.Equal(t, driver.StatusQueued, call("W", []string{"a", "b"}, 1, []int{3, 1}).Status)
	r := call("W", []string{"a", "b"}, 1, []int{3, 1})
	require.Equal(t, driver.StatusQueued, r.Status)
	require.Equal(t, 1, r.Key, "W waits on b: %+v", r)
	require.EqualValues(t, 1, r.Count, "b's count")
	require.EqualValues(t, 1, r.Queue, "b's queue: W")
}

// A queued waiter of several keys whose ticket its own ask's serving drops
// (its process stalled past its liveness: dead, 1.5 claim windows before
// its deadline) is a newcomer there, and a newcomer of several keys is
// kept out of a key whose serving went past a heavy waiter (Y, of one key,
// under its bound), as any newcomer of several keys: it queues again
// naming a, and Y keeps a's room. Its ask takes b's limit to 2, so that
// only a's heavy waiter keeps it out.
func droppedWaiterIsANewcomer(t *testing.T, srv Server) {
	s := srv.Store(t, "droppedWaiterIsANewcomer")
	h := storeCall{t, s}
	require.Equal(t, driver.StatusAdmitted, h.admit("H", "a", 2, 3, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("G", "b", 1, 1, 0, "f", false).Status)
	require.Equal(t, driver.StatusQueued, h.admit("Y", "a", 2, 3, 0, "f", true).Status) // heavy: 1 unit free on a
	claim := 20 * time.Millisecond                                                      // its process lives 3 claim windows
	ask := func(limits []int) driver.AdmitResult {
		t.Helper()
		r, err := s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"a", "b"}, Limits: limits,
			Units: 1, TTL: time.Hour, Claim: claim, Wait: true, Flow: "f", Weight: 1, Proc: "pw", MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		return r
	}
	r := ask([]int{3, 1})
	require.Equal(t, driver.StatusQueued, r.Status, "%+v", r)
	time.Sleep(10 * claim) // W's process is dead: its ticket is dropped where serving meets it
	r = ask([]int{3, 2})
	require.Equal(t, driver.StatusQueued, r.Status, "W, a newcomer of two keys, does not pass Y on a: %+v", r)
	require.Equal(t, 0, r.Key, "a is kept for Y: %+v", r)
	require.Equal(t, 2, h.count("a"), "H's 2 units: Y's room kept")
}

// A limit raised makes room that no release serves: the next waiter's
// ask serves it (driver.AdmitCall step 5), going past a heavy waiter of
// one key as a release would. H holds 3 of 3; W (3 units) waits at the
// head, L (2) behind it; the limit goes to 5: L's ask, made as the
// fleet's client makes it (the epoch it saw, a pause), takes the 2 units
// W cannot use, and W's ask leaves it queued.
func raisedLimitServedOnAsk(t *testing.T, srv Server) {
	s := srv.Store(t, "raisedLimitServedOnAsk")
	c := &clientCalls{t: t, s: s}
	call := func(name string, units, limit int, wait bool) driver.AdmitResult {
		t.Helper()
		return c.call(name, []string{"k"}, units, []int{limit}, wait)
	}
	require.Equal(t, driver.StatusAdmitted, call("H", 3, 3, false).Status)
	require.Equal(t, driver.StatusQueued, call("W", 3, 3, true).Status)
	require.Equal(t, driver.StatusQueued, call("L", 2, 3, true).Status)
	r := call("L", 2, 5, true)
	require.Equal(t, driver.StatusAdmitted, r.Status, "L takes the room the raised limit made, past W: %+v", r)
	require.Equal(t, driver.StatusQueued, call("W", 3, 5, true).Status)
	n, err := s.Count(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, 5, n, "H and L")
}

// Serving stops at a waiter of several keys once it is heavy (its units
// have no room left on the key served), though it had room when serving
// passed it (for want of room on its other key): grants behind it do not
// take the room it waits for (driver.ReleaseCall: "It stops at once at a
// heavy waiter of several keys").
func severalKeysWaiterTurnsHeavy(t *testing.T, srv Server) {
	s := srv.Store(t, "severalKeysWaiterTurnsHeavy")
	h := storeCall{t, s}
	require.Equal(t, driver.StatusAdmitted, h.admit("H", "a", 4, 4, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("G", "b", 4, 4, 0, "f", false).Status)
	require.Equal(t, driver.StatusQueued, h.admitKeys("W", []string{"a", "b"}, 3, []int{4, 4}, 0, true).Status)
	for _, l := range []string{"L1", "L2", "L3", "L4"} {
		require.Equal(t, driver.StatusQueued, h.admit(l, "a", 1, 4, 0, "f", true).Status)
	}
	h.release("H", "a", 4)
	// L1 and L2 take 2 units; W (3) is heavy then: serving stops.
	require.Equal(t, 2, h.count("a"), "serving went past W, heavy on a")
}

// A grant given back (its key's limit lowered since: driver.AdmitCall
// step 6) leaves every one of its keys before their queues are served, so
// that the waiter of the same keys behind it takes the room, in order.
func givenBackLeavesEveryKeyFirst(t *testing.T, srv Server) {
	s := srv.Store(t, "givenBackLeavesEveryKeyFirst")
	h := storeCall{t, s}
	ab := []string{"a", "b"}
	require.Equal(t, driver.StatusAdmitted, h.admit("Ha", "a", 4, 4, 0, "f", false).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("Hb", "b", 2, 2, 0, "f", false).Status)
	require.Equal(t, driver.StatusQueued, h.admitKeys("W", ab, 2, []int{4, 2}, 0, true).Status)
	require.Equal(t, driver.StatusQueued, h.admitKeys("Y", ab, 1, []int{4, 2}, 0, true).Status)
	for _, z := range []string{"Z1", "Z2"} {
		require.Equal(t, driver.StatusQueued, h.admitKeys(z, []string{"a"}, 1, []int{4}, 0, true).Status)
	}
	require.Equal(t, driver.StatusQueued, h.admitKeys("Z3", []string{"a"}, 2, []int{4}, 0, true).Status)
	h.release("Hb", "b", 2)
	h.release("Ha", "a", 4) // W, Z1, Z2 granted; Y waits for b
	require.Equal(t, 4, h.count("a"))
	require.Equal(t, 2, h.count("b"))
	// W claims under a lower limit of b: its grant is given back.
	require.Equal(t, driver.StatusQueued, h.admitKeys("W", ab, 2, []int{4, 1}, 0, true).Status)
	// Y, before Z3, takes a unit of a and one of b.
	require.Equal(t, 1, h.count("b"), "Y was not served")
	require.Equal(t, 3, h.count("a"))
}

func oddKeysSeveral(t *testing.T, srv Server) {
	s := srv.Store(t, "oddKeysSeveral")
	odd := []string{"\xff\xfe", "a\x00b", `q"uo\te`, "k#x", "abandoned:x", "é/ü", "{x}", "],[", "\\u0000", "\x7f\x80", "a|b", "}{"}
	{
		h := storeCall{t, s}
		for i, k1 := range odd {
			k2 := odd[(i+1)%len(odd)] + "2"
			// k1 full (H), k2 full (G); W waits on both.
			require.Equal(t, driver.StatusAdmitted, h.admit("H"+k1, k1, 1, 1, 0, "f", false).Status)
			require.Equal(t, driver.StatusAdmitted, h.admit("G"+k1, k2, 1, 1, 0, "f", false).Status)
			w := "W" + k1
			require.Equal(t, driver.StatusQueued, h.admitKeys(w, []string{k1, k2}, 1, []int{1, 1}, 0, true).Status)
			// G leaves: k2 has room, k1 has none: W is not granted.
			h.release("G"+k1, k2, 1)
			require.Equal(t, 0, h.count(k2), "%q: W granted though %q is full", k2, k1)
			// H leaves: W is granted on both, and claims.
			h.release("H"+k1, k1, 1)
			require.Equal(t, 1, h.count(k1), "%q", k1)
			require.Equal(t, 1, h.count(k2), "%q", k2)
			require.Equal(t, driver.StatusAdmitted, h.admitKeys(w, []string{k1, k2}, 1, []int{1, 1}, 0, true).Status, "%q", k1)
			require.NoError(t, s.Release(context.Background(), &driver.ReleaseCall{TTL: time.Hour, Claim: time.Minute,
				Pairs: []driver.Release{{Key: k1, Lease: leaseID(w), Limit: 1}, {Key: k2, Lease: leaseID(w), Limit: 1}}}))
			require.Equal(t, 0, h.count(k1))
			require.Equal(t, 0, h.count(k2))
		}
	}
}
