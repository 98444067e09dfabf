package fleet_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// Two gateways share a self-hosted server whose cache holds 20,000 tokens:
// each request is a lease that weighs its tokens, under the server's cap
// and its model's, across both.
func ExampleRegistry_AcquireAllN() {
	store := memstore.New() // each gateway's client of the fleet's Redis or PostgreSQL
	ctx := context.Background()
	gateway := func() *fleet.Registry[string] {
		caps := fleet.New[string](store, slots.Unlimited)
		caps.SetLimit("tokens", 20000)
		caps.SetLimit("model_tokens:glm-5", 12000)
		return caps
	}
	a, b := gateway(), gateway()
	defer a.Close()
	defer b.Close()

	long, err := a.AcquireAllN(ctx, 9000, "tokens", "model_tokens:glm-5")
	if err != nil {
		panic(err)
	}
	_, err = b.TryAcquireAllN(4000, "tokens", "model_tokens:glm-5")
	fmt.Println("4,000 more for glm-5:", errors.Is(err, slots.ErrLimitReached))
	other, err := b.TryAcquireN("tokens", 8000) // another model
	fmt.Println("8,000 for another model:", err == nil)
	n, _ := b.InFlight(ctx, "tokens")
	fmt.Println("tokens in flight:", n)
	_, err = b.TryAcquireN("tokens", 30000)
	fmt.Println("a prompt larger than the cache:", errors.Is(err, slots.ErrExceedsLimit))
	long.Release()
	other.Release()
	// Output:
	// 4,000 more for glm-5: true
	// 8,000 for another model: true
	// tokens in flight: 17000
	// a prompt larger than the cache: true
}
