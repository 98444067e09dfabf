package fleettest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// grantsOnly is a process's store that lets a queued waiter be admitted
// only through a grant the store delivers by Listen: once the store has
// queued a ticket, the waiter's later asks for it are answered "still
// queued" here, without reaching the store (which would serve the queue
// itself), until the ticket's grant arrives. So a waiter on it is
// admitted only if a release, or a withdrawal, served the queue and woke
// it. It counts the grants delivered, and the times Listen listened: a
// wake-up sent while it did not may be lost, so after a break (a second
// Listening) the asks of tickets queued before it go through, as the
// client's recovery needs.
type grantsOnly struct {
	driver.Store
	grants, listening atomic.Int64

	mu      sync.Mutex
	queued  map[string]queuedReply // by ticket
	granted map[string]bool
}

// queuedReply is the store's reply that queued a ticket, and when it came.
type queuedReply struct {
	res driver.AdmitResult
	at  time.Time
}

func newGrantsOnly(s driver.Store) *grantsOnly {
	return &grantsOnly{Store: s, queued: map[string]queuedReply{}, granted: map[string]bool{}}
}

// held returns the answer to c if it is an ask for a queued ticket not
// granted yet: the store's reply that queued it, its clock moved on by the
// time since.
func (g *grantsOnly) held(c *driver.AdmitCall) (driver.AdmitResult, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	q, ok := g.queued[c.Lease]
	if !ok || g.granted[c.Lease] {
		return driver.AdmitResult{}, false
	}
	res := q.res
	res.Now += time.Since(q.at).Milliseconds()
	return res, true
}

func (g *grantsOnly) saw(c *driver.AdmitCall, res driver.AdmitResult) {
	if res.Err != nil || res.Status != driver.StatusQueued {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.queued[c.Lease]; !ok {
		g.queued[c.Lease] = queuedReply{res, time.Now()}
	}
}

func (g *grantsOnly) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if res, ok := g.held(c); ok {
		return res, nil
	}
	res, err := g.Store.AdmitOne(ctx, c)
	g.saw(c, res)
	return res, err
}

func (g *grantsOnly) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	out := make([]driver.AdmitResult, len(calls))
	var pass []*driver.AdmitCall
	var at []int
	for i, c := range calls {
		if res, ok := g.held(c); ok {
			out[i] = res
			continue
		}
		pass, at = append(pass, c), append(at, i)
	}
	if len(pass) == 0 {
		return out, nil
	}
	res, err := g.Store.Admit(ctx, pass)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		out[i] = res[j]
		g.saw(pass[j], res[j])
	}
	return out, nil
}

func (g *grantsOnly) Listen(ctx context.Context, proc string, l driver.Listener) {
	g.Store.Listen(ctx, proc, grantListener{l, g})
}

func (l grantListener) Listening() {
	if l.g.listening.Add(1) > 1 {
		l.g.mu.Lock()
		for ticket := range l.g.queued {
			l.g.granted[ticket] = true
		}
		l.g.mu.Unlock()
	}
	l.Listener.Listening()
}

type grantListener struct {
	driver.Listener
	g *grantsOnly
}

func (l grantListener) Granted(ticket string) {
	l.g.mu.Lock()
	l.g.granted[ticket] = true
	l.g.mu.Unlock()
	l.g.grants.Add(1)
	l.Listener.Granted(ticket)
}

// heldAgainst returns two processes of the fleet name, each capping keys
// at 1: a holder, and a waiter on a grantsOnly store that listens already.
func heldAgainst(t *testing.T, srv Server, name string) (holder, waiter *fleet.Registry[string], store *grantsOnly) {
	t.Helper()
	holder = process(t, srv, name, 1)
	store = newGrantsOnly(srv.Store(t, name))
	waiter = fleet.New[string](store, 1)
	t.Cleanup(waiter.Close)
	listens(t, store)
	return holder, waiter, store
}

// listens waits until the process on g listens for its grants.
func listens(t *testing.T, g *grantsOnly) {
	t.Helper()
	require.Eventually(t, func() bool { return g.listening.Load() > 0 }, wait, time.Millisecond, "the process listens")
}

// An admission's counts, the evidence of a learned cap (what the upstream
// had in flight with the start), are the leases held: a grant its waiter
// has not claimed yet is left out, as its request is not at the upstream,
// and counted once claimed. Called on the store directly.
func countsLeaveOutGrants(t *testing.T, srv Server) {
	s := srv.Store(t, "counts")
	ctx := context.Background()
	call := func(lease string, limit int, wait bool) *driver.AdmitCall {
		return &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{limit}, TTL: time.Minute, Wait: wait,
			Starts: true, Claim: time.Minute, Live: 5 * time.Minute, Proc: "counts-p", Weight: 1, MaxQueue: -1, MaxFlowQueue: -1}
	}
	admit := func(c *driver.AdmitCall, want driver.Status) driver.AdmitResult {
		t.Helper()
		res, err := s.AdmitOne(ctx, c)
		require.NoError(t, err)
		require.NoError(t, res.Err)
		require.Equal(t, want, res.Status, "%s under %d", c.Lease, c.Limits[0])
		return res
	}
	admit(call("a", 2, false), driver.StatusAdmitted)
	x := admit(call("x", 2, false), driver.StatusAdmitted)
	require.Equal(t, []int64{2}, x.Counts, "a and x")
	admit(call("w", 2, true), driver.StatusQueued)
	// x's release hands its place to w: a grant, not claimed yet.
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: time.Minute, Pairs: []driver.Release{{Key: "k", Lease: "x", Limit: 2}}}))
	n, err := s.Count(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 2, n, "a, and w's grant, are leases")
	nres := admit(call("n", 3, false), driver.StatusAdmitted)
	assert.Equal(t, []int64{2}, nres.Counts, "a and n held; w's grant left out")
	wres := admit(call("w", 3, true), driver.StatusAdmitted)
	assert.Equal(t, []int64{3}, wres.Counts, "w's claim counts it")
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: time.Minute, Pairs: []driver.Release{
		{Key: "k", Lease: "a", Limit: 3}, {Key: "k", Lease: "n", Limit: 3}, {Key: "k", Lease: "w", Limit: 3}}}))
}
