package fleet_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// An operator turns org-b down to 1 request in flight through one gateway,
// and every gateway of the fleet holds it. Each gateway caps each org
// across the fleet; an org's limit is its override if it has one, else the
// configured limit.
func ExampleOverrides() {
	store := memstore.New() // each gateway's client of the fleet's Redis or PostgreSQL
	const configured = 8
	ctx := context.Background()

	gateway := func() (*fleet.Registry[string], *fleet.Overrides) {
		// onChange (nil here) would refresh the org's keys in the local
		// mirror; the fleet asks Keys.Limit at each admission.
		ov, err := fleet.NewOverrides(store, "org-limits", nil, nil)
		if err != nil {
			panic(err)
		}
		caps := fleet.NewWithKeys(store, configured, fleet.Keys[string]{Limit: func(org string) int {
			if n, ok := ov.Get(org); ok {
				return n
			}
			return configured
		}})
		return caps, ov
	}
	a, aOverrides := gateway()
	defer a.Close()
	defer aOverrides.Close()
	b, bOverrides := gateway()
	defer b.Close()
	defer bOverrides.Close()

	if err := aOverrides.Set(ctx, "org-b", 1); err != nil {
		fmt.Println(err) // the store did not answer
		return
	}
	// Gateway b takes the change from the store's message, or within a
	// second from its own read; Sync reads it now.
	if err := bOverrides.Sync(ctx); err != nil {
		fmt.Println(err)
		return
	}
	s, err := a.TryAcquire("org-b")
	fmt.Println("through a:", err)
	_, err = b.TryAcquire("org-b")
	fmt.Println("through b, limit reached:", errors.Is(err, slots.ErrLimitReached))
	s.Release()
	// Output:
	// through a: <nil>
	// through b, limit reached: true
}
