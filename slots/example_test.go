package slots_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/inflight-go/inflight/slots"
)

func ExampleLimiter() {
	// At most two requests to the upstream at once.
	lim := slots.NewLimiter(2)

	a, _ := lim.Acquire(context.Background())
	b, _ := lim.Acquire(context.Background())
	fmt.Println("in flight:", lim.InFlight())

	// A third caller that must not wait is turned away, with the numbers an
	// HTTP layer needs for a 429.
	_, err := lim.TryAcquire()
	var le *slots.LimitError
	if errors.As(err, &le) {
		fmt.Println(errors.Is(err, slots.ErrLimitReached), le.InFlight, le.Limit, le.RetryAfter)
	}

	a.Release()
	a.Release() // a second release does nothing
	b.Release()
	fmt.Println("in flight:", lim.InFlight())
	// Output:
	// in flight: 2
	// true 2 2 1s
	// in flight: 0
}

func ExampleWithFailOpen() {
	// Wait at most 30 s for a slot, then proceed without one rather than
	// stall every caller behind a hung upstream.
	lim := slots.NewLimiter(8, slots.WithMaxWait(30*time.Second), slots.WithFailOpen())

	s, err := lim.Acquire(context.Background())
	if err != nil {
		return
	}
	defer s.Release()
	fmt.Println("bypassed:", s.Bypassed())
	// Output: bypassed: false
}

func ExampleLimiter_SetLimit() {
	lim := slots.NewLimiter(1)
	s, _ := lim.TryAcquire()

	lim.SetLimit(0) // lowering never takes a slot from its holder
	fmt.Println(lim.InFlight(), lim.Limit())
	s.Release()

	lim.SetLimit(slots.Unlimited)
	_, err := lim.TryAcquire()
	fmt.Println(err)
	// Output:
	// 1 0
	// <nil>
}
