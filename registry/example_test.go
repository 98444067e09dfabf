package registry_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

func ExampleRegistry() {
	// Each organisation may have 64 requests in flight, org-a only 1.
	reg := registry.New[string](64)
	reg.SetLimit("org-a", 1)

	s, _ := reg.TryAcquire("org-a")
	_, err := reg.TryAcquire("org-a")
	var le *slots.LimitError
	if errors.As(err, &le) {
		fmt.Printf("%s: %d/%d in flight\n", le.Key, le.InFlight, le.Limit)
	}
	fmt.Println("keys:", reg.Keys())

	s.Release()
	fmt.Println("keys:", reg.Keys()) // idle keys are removed at once
	// Output:
	// org-a: 1/1 in flight
	// keys: 1
	// keys: 0
}

func ExampleRegistry_AcquireAll() {
	// A provider allows 5 requests at once, and its slowest model 2.
	reg := registry.New[string](slots.Unlimited)
	reg.SetLimit("provider", 5)
	reg.SetLimit("provider/glm-5", 2)

	ctx := context.Background()
	var held []*slots.Slot
	for range 2 {
		s, _ := reg.AcquireAll(ctx, "provider", "provider/glm-5")
		held = append(held, s)
	}
	// The model is full, but other models still get provider slots.
	_, err := reg.TryAcquireAll("provider", "provider/glm-5")
	fmt.Println(errors.Is(err, slots.ErrLimitReached))
	other, err := reg.TryAcquireAll("provider", "provider/glm-4-air")
	fmt.Println(err, reg.InFlight("provider"))

	other.Release()
	for _, s := range held {
		s.Release() // frees the provider and the model slot together
	}
	fmt.Println(reg.InFlight("provider"), reg.Keys())
	// Output:
	// true
	// <nil> 3
	// 0 0
}

func ExampleRegistry_AcquireAllN() {
	// A self-hosted model holds 20,000 tokens in flight, and each tenant
	// 8,000 of them; a request weighs its prompt and its max_tokens.
	reg := registry.New[string](8000)
	reg.SetLimit("model", 20000)

	ctx := context.Background()
	big, _ := reg.AcquireAllN(ctx, 7500, "tenant-a", "model")
	small, _ := reg.AcquireAllN(ctx, 600, "tenant-b", "model")
	fmt.Println(reg.InFlight("model"), reg.InFlight("tenant-a"))

	// tenant-a has 500 tokens left: a request of 900 does not fit now.
	_, err := reg.TryAcquireAllN(900, "tenant-a", "model")
	fmt.Println(errors.Is(err, slots.ErrLimitReached))
	// A request larger than a key's whole limit could never be served.
	_, err = reg.AcquireAllN(ctx, 9000, "tenant-b", "model")
	fmt.Println(errors.Is(err, slots.ErrExceedsLimit))

	big.Release() // frees its 7,500 tokens of both keys
	small.Release()
	fmt.Println(reg.InFlight("model"))
	// Output:
	// 8100 7500
	// true
	// true
	// 0
}
