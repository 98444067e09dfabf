package fleettest

import (
	"context"
	"testing"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// patientClaims is a process's store whose grants wait for their claim as
// long as the suite waits for anything (wait), not the client's claim
// window (at most a second): every call's Claim is stretched to it (and so
// the liveness the store keeps, at least three Claim windows). A test that
// asserts the order in which waiters are admitted uses it: on a busy
// machine a waiter's wake-up and claim may come more than a second after
// its grant, and a grant nobody claims in its window is, by the protocol,
// lost to the waiter (its key's room goes to the next waiter, and the late
// one queues again as a newcomer: PROTOCOL.md, "Waiting"; driver.AdmitCall,
// steps 6 and 9). The order the store grants in does not depend on time;
// the claims' lateness would.
type patientClaims struct {
	driver.Store
}

func (p patientClaims) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	return p.Store.AdmitOne(ctx, p.admit(c))
}

func (p patientClaims) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	stretched := make([]*driver.AdmitCall, len(calls))
	for i, c := range calls {
		stretched[i] = p.admit(c)
	}
	return p.Store.Admit(ctx, stretched)
}

func (p patientClaims) admit(c *driver.AdmitCall) *driver.AdmitCall {
	s := *c
	s.Claim = max(s.Claim, wait)
	return &s
}

func (p patientClaims) Release(ctx context.Context, c *driver.ReleaseCall) error {
	s := *c
	s.Claim = max(s.Claim, wait)
	return p.Store.Release(ctx, &s)
}

func (p patientClaims) Abandon(ctx context.Context, calls []*driver.AbandonCall) ([]error, error) {
	stretched := make([]*driver.AbandonCall, len(calls))
	for i, c := range calls {
		s := *c
		s.Claim = max(s.Claim, wait)
		stretched[i] = &s
	}
	return p.Store.Abandon(ctx, stretched)
}

// Pipelines passes on the store's (embedding hides it: see driver.Pipeliner).
func (p patientClaims) Pipelines() bool {
	pl, ok := p.Store.(driver.Pipeliner)
	return ok && pl.Pipelines()
}

// patientProcesses is processes, each on a patientClaims store: n
// processes of the fleet name on srv whose grants wait for their claims.
func patientProcesses(t testing.TB, srv Server, name string, n, limit int, opts ...fleet.Option) []*fleet.Registry[string] {
	t.Helper()
	rs := make([]*fleet.Registry[string], n)
	for i := range rs {
		rs[i] = fleet.New[string](patientClaims{srv.Store(t, name)}, limit, opts...)
		t.Cleanup(rs[i].Close)
	}
	return rs
}

// Patient returns s with every call's Claim stretched to the suite's wait
// (patientClaims), for a store's own tests of the order its waiters are
// admitted in through fleet.Registry: on a busy machine a woken waiter
// may claim its grant after the client's claim window, and lose it.
func Patient(s driver.Store) driver.Store { return patientClaims{s} }
