package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

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

// Each tenant's budget of 1,000 tokens a minute, kept in the process
// beside the provider's caps: the Transport reserves a request's estimate
// before it waits for a slot, sends nothing a tenant cannot afford, and
// settles the reservation with the usage the answer reports.
func ExampleWithBudgets() {
	type tenantKey struct{} // the context's tenant, set by the program's handler
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":300,"completion_tokens":120}}`)
	}))
	defer upstream.Close()
	gate, err := pacing.NewGate("provider", pacing.Config{MaxConcurrentRequests: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close()
	tenants := pacing.NewBudgets(func(string) *pacing.BudgetLimits {
		return &pacing.BudgetLimits{TokensPerMinute: 1000}
	})
	client := &http.Client{Transport: pacing.NewTransport(nil, gate,
		pacing.WithBudgets(func(ctx context.Context, _ string, cost pacing.Tokens) (*pacing.Reservation, error) {
			tenant, _ := ctx.Value(tenantKey{}).(string)
			return tenants.Reserve(tenant, cost)
		}))}

	ask := func(tenant string, estimate pacing.Tokens) error {
		ctx := pacing.WithTokens(context.WithValue(context.Background(), tenantKey{}, tenant), estimate)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, upstream.URL, strings.NewReader(`{"model":"m"}`))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body) // its usage settles the reservation as it ends
		return err
	}
	fmt.Println(ask("acme", pacing.Tokens{Input: 300, Output: 500}), tenants.Status("acme")[0].Left)
	err = ask("acme", pacing.Tokens{Input: 300, Output: 500})
	var le *slots.LimitError
	fmt.Println(errors.Is(err, pacing.ErrOverBudget), errors.As(err, &le) && le.RetryAfter > 0)
	fmt.Println(ask("globex", pacing.Tokens{Input: 300, Output: 500}))
	// Output:
	// <nil> 580
	// true true
	// <nil>
}
