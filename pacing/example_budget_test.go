package pacing_test

import (
	"errors"
	"fmt"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A tenant's budget of 1,000 tokens a minute, kept beside the provider's
// caps: each request reserves its estimate before it queues for a slot,
// starts the reservation as it is sent (a wait longer than the minute is
// charged again, or refused, then), and settles it with what the upstream
// reported, which returns the overestimate.
func ExampleBudget() {
	tenant, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000})
	if err != nil {
		panic(err)
	}
	r, err := tenant.Reserve(pacing.Tokens{Input: 300, Output: 500})
	if err != nil {
		panic(err)
	}
	// ... the request waits for its slot at the provider ...
	if err := r.Start(); err != nil {
		r.Cancel() // not sent: it charges nothing
		return
	}
	// ... it is sent, and its answer reports its usage ...
	r.Settle(pacing.Tokens{Input: 300, Output: 120})
	fmt.Println("left:", tenant.Status()[0].Left)

	_, err = tenant.Reserve(pacing.Tokens{Input: 700})
	var le *slots.LimitError
	fmt.Println(errors.Is(err, pacing.ErrOverBudget), errors.As(err, &le) && le.RetryAfter > 0)
	// Output:
	// left: 580
	// true true
}
