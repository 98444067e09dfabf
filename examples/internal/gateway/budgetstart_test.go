package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A request whose reservation of a fleet budget left the budget's minute
// while it waited for the provider, and that the budget, spent by others
// meanwhile, can no longer take, is not sent: spending.Start answers the
// budget's refusal, which the provider's Transport returns as its refusal
// (the proxy's ErrorHandler answers it as the provider's caps' refusals),
// and its reservations are returned. One that still fits is sent, charged
// in the second it starts.
func TestBudgetStartRefusesAReservationPastItsMinute(t *testing.T) {
	now, advance := stepClock()
	store := memstore.NewWithClock(now)
	b, err := fleet.NewBudget(store, "provider", pacing.BudgetLimits{TokensPerMinute: 100}, 0)
	require.NoError(t, err)
	reserve := func(tokens int) *spending {
		rs, _, err := fleet.ReserveAll(context.Background(), pacing.Tokens{Input: tokens}, nil, b)
		require.NoError(t, err)
		return &spending{t: tenant{"acme", "m"}, fleet: rs, down: func() bool { return false }}
	}
	send, sent := spendingSender(t)

	late := reserve(60)
	advance(61 * time.Second) // its charge has left the minute
	require.NoError(t, send(reserve(100)))
	err = send(late)
	require.ErrorIs(t, err, pacing.ErrOverBudget, "60 more over the 100 started in this minute")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Positive(t, le.RetryAfter)
	assert.Equal(t, "tokens_per_minute", le.Cap, "the provider's budget")
	assert.Equal(t, 1, sent(), "the late request not sent")
	used, err := b.Used(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 100, used[0], "the late request charges nothing")

	advance(61 * time.Second)
	fits := reserve(40)
	advance(61 * time.Second)
	err = send(fits)
	require.NoError(t, err, "40 fits the empty minute")
	assert.Equal(t, 2, sent())
	used, err = b.Used(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 40, used[0], "charged again in the second it starts")
}

// spendingSender returns send, which sends a request through a provider's
// Transport whose WithFleetBudgets reserves s, and the count of requests
// its base sent (each answered 200).
func spendingSender(t *testing.T) (send func(s *spending) error, sent func() int) {
	gate, err := pacing.NewGate("p", pacing.Config{})
	require.NoError(t, err)
	t.Cleanup(gate.Close)
	n := 0
	var next *spending
	rt := pacing.NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		n++
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	}), gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		return next, nil
	}))
	return func(s *spending) error {
		next = s
		req := httptest.NewRequest(http.MethodPost, "http://upstream/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}, func() int { return n }
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A model's or an org's budget that refuses a request at its start is
// named as at its reservation (model_..., tenant_...).
func TestBudgetStartNamesTheBudget(t *testing.T) {
	for name, want := range map[string]string{"model:m": "model_tokens_per_minute", orgBudgetName("acme"): "tenant_tokens_per_minute"} {
		s := &spending{t: tenant{"acme", "m"}, fleet: lateReservation(t, name), down: func() bool { return false }}
		err := s.Start(context.Background())
		var le *slots.LimitError
		require.ErrorAs(t, err, &le, name)
		assert.Equal(t, want, le.Cap, name)
		assert.Equal(t, want, refusedBy(err), name)
	}
}

// lateReservation returns a reservation of 60 tokens of the fleet's
// budget name (100 a minute) that has left the budget's minute while 100
// more started: its Start is refused.
func lateReservation(t *testing.T, name string) *fleet.Reservations {
	t.Helper()
	now, advance := stepClock()
	b, err := fleet.NewBudget(memstore.NewWithClock(now), name, pacing.BudgetLimits{TokensPerMinute: 100}, 0)
	require.NoError(t, err)
	late, _, err := fleet.ReserveAll(context.Background(), pacing.Tokens{Input: 60}, nil, b)
	require.NoError(t, err)
	advance(61 * time.Second)
	other, _, err := fleet.ReserveAll(context.Background(), pacing.Tokens{Input: 100}, nil, b)
	require.NoError(t, err)
	require.NoError(t, other.Start(context.Background()))
	return late
}

// stepClock is a clock for a store that moves only when advance is
// called.
func stepClock() (now func() time.Time, advance func(time.Duration)) {
	var mu sync.Mutex
	at := time.Unix(1_800_000_000, 0)
	return func() time.Time { mu.Lock(); defer mu.Unlock(); return at },
		func(d time.Duration) { mu.Lock(); at = at.Add(d); mu.Unlock() }
}

// An org's budget that refuses its request at the start is named
// tenant_... by the provider's Transport too, whatever the org's name: an
// org named "model:x" was named model_tenant_... (the Transport took the
// refusal's key, the org's, for a model's).
func TestBudgetStartNamesAnOrgNamedLikeAModel(t *testing.T) {
	for _, org := range []string{"acme", "model:x"} {
		late := lateReservation(t, orgBudgetName(org))
		gate, err := pacing.NewGate("p", pacing.Config{})
		require.NoError(t, err)
		defer gate.Close()
		s := &spending{t: tenant{org, "m"}, fleet: late, down: func() bool { return false }}
		rt := pacing.NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
		}), gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
			return s, nil
		}))
		_, err = rt.RoundTrip(httptest.NewRequest(http.MethodPost, "http://upstream/v1/chat/completions", strings.NewReader(`{"model":"m"}`)))
		require.Error(t, err)
		assert.Equal(t, "tenant_tokens_per_minute", refusedBy(err), "org %q", org)
	}
}

// Without a fleet, an org's budget kept here is moved to the request's
// start too: a reservation that left the minute while its request waited
// for the provider is refused at its start if the org's budget, spent by
// others meanwhile, can no longer take it (named tenant_..., not sent,
// charged nothing), and one reserved before a wait still counts a minute
// from its start. Before, the charge stayed in its reservation's second:
// 600 reserved at 0 and started at 61 s went beside 600 reserved and
// started at 61 s, 1,200 started in a minute against 1,000.
func TestBudgetStartMovesAnOrgsLocalReservation(t *testing.T) {
	clk := clock.NewMock()
	orgs := pacing.NewBudgets(func(string) *pacing.BudgetLimits {
		return &pacing.BudgetLimits{TokensPerMinute: 1000}
	}, slots.WithClock(clk))
	reserve := func(tokens int) *spending {
		r, err := orgs.Reserve("acme", pacing.Tokens{Input: tokens})
		require.NoError(t, err)
		return &spending{t: tenant{"acme", "m"}, local: r}
	}
	send, sent := spendingSender(t)

	late := reserve(600)
	clk.Add(61 * time.Second)
	require.NoError(t, send(reserve(600)))
	err := send(late)
	require.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, "tenant_tokens_per_minute", refusedBy(err))
	assert.Equal(t, 1, sent(), "the late request not sent")

	clk.Add(61 * time.Second)
	waited := reserve(600)
	clk.Add(30 * time.Second)
	require.NoError(t, send(waited))
	clk.Add(31 * time.Second) // 61 s after its reservation, 31 s after its start
	_, err = orgs.Reserve("acme", pacing.Tokens{Input: 500})
	assert.ErrorIs(t, err, pacing.ErrOverBudget, "the 600 started 31 s ago count")
	assert.Equal(t, 2, sent())
}

// slowBudgets is a store whose budget calls each take delay.
type slowBudgets struct {
	*memstore.Store
	delay time.Duration
}

func (s slowBudgets) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return driver.BudgetResult{}, ctx.Err()
	}
	return s.Store.Budget(ctx, c)
}

// A request's corrections reach each of its budgets (its org's, the
// provider's, its model's), each call within its Budget's timeout: with
// one timeout for them all, a store whose calls each take well within it
// left the last budget's overestimate unreturned.
func TestSpendingSettlesEveryBudgetOnASlowStore(t *testing.T) {
	store := slowBudgets{Store: memstore.New(), delay: 150 * time.Millisecond}
	const timeout = 400 * time.Millisecond
	var bs []*fleet.Budget
	for _, name := range []string{orgBudgetName("acme"), "provider", "model:m"} {
		b, err := fleet.NewBudget(store, name, pacing.BudgetLimits{TokensPerMinute: 10_000}, timeout)
		require.NoError(t, err)
		bs = append(bs, b)
	}
	org, _, err := fleet.ReserveAll(context.Background(), pacing.Tokens{Input: 100, Output: 100}, nil, bs[0])
	require.NoError(t, err)
	rest, _, err := fleet.ReserveAll(context.Background(), pacing.Tokens{Input: 100, Output: 100}, nil, bs[1], bs[2])
	require.NoError(t, err)
	s := &spending{t: tenant{"acme", "m"}, fleet: org.Join(rest), down: func() bool { return false }}
	require.NoError(t, s.Settle(context.Background(), pacing.Tokens{Input: 30, Output: 20}))
	for i, name := range []string{"org", "provider", "model"} {
		used, err := bs[i].Used(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 50, used[0], "%s: settled with the usage", name)
	}
}

// An org's fleet budget that refuses a request tells it when the
// provider's and its model's budgets, which the Transport reserves later,
// would take it too, and names the one that takes it last. Here the org
// has room again at 60 s and the provider only at 90 s: the request was
// told 29 s, came back, and was refused by the provider.
func TestOrgRefusalAsksTheProvidersBudgets(t *testing.T) {
	now, advance := stepClock()
	store := memstore.NewWithClock(now)
	caps := fleet.New[string](memstore.New(), 1, fleet.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(caps.Close)
	limits := pacing.BudgetLimits{TokensPerMinute: 100}
	budget := func(name string, tpm int) *fleet.Budget {
		b, err := fleet.NewBudget(store, name, pacing.BudgetLimits{TokensPerMinute: tpm}, 0)
		require.NoError(t, err)
		return b
	}
	fb := &fleetBudgets{tenants: store, timeout: time.Second, models: map[string]*fleet.Budget{}}
	g := &Gateway{caps: caps, fleetBudgets: fb, orgLimits: func(string) *pacing.BudgetLimits { return &limits }}
	acme := tenant{"acme", "m"}
	spend := func(tokens int, budgets ...*fleet.Budget) {
		rs, _, err := fleet.ReserveAll(context.Background(), pacing.Tokens{Input: tokens}, nil, budgets...)
		require.NoError(t, err)
		require.NoError(t, rs.Start(context.Background()))
	}

	for _, tc := range []struct {
		name     string
		provider bool // the provider's budget binds, else the model's
		want     string
	}{
		{name: "the provider's budget", provider: true, want: "tokens_per_minute"},
		{name: "the model's budget", want: "model_tokens_per_minute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			advance(10 * time.Minute) // every minute before is over
			var later *fleet.Budget
			if tc.provider {
				later = budget("provider", 150)
				fb.provider, fb.models["m"] = later, budget("model:m", 1000)
			} else {
				later = budget("model:m", 150)
				fb.provider, fb.models["m"] = budget("provider", 1000), later
			}
			org := budget(orgBudgetName("acme"), 100)
			spend(50, org, later) // acme's, at 0 s
			advance(30 * time.Second)
			spend(100, later) // another org's, at 30 s
			advance(time.Second)

			s, capName, err := g.reserveBudgets(context.Background(), acme, pacing.Tokens{Input: 60})
			require.Nil(t, s)
			require.ErrorIs(t, err, pacing.ErrOverBudget)
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, tc.want, capName)
			assert.Equal(t, tc.want, le.Cap)
			assert.GreaterOrEqual(t, le.RetryAfter, 59*time.Second, "when the %s takes 60 more, at 90 s", tc.name)

			used, err := org.Used(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 50, used[0], "the refused request charges the org nothing")
			used, err = later.Used(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 150, used[0], "nor the budget asked")

			// With room in the provider's and the model's budgets, the
			// org's own refusal stands: its time, its name.
			fb.provider, fb.models["m"] = nil, nil
			_, capName, err = g.reserveBudgets(context.Background(), acme, pacing.Tokens{Input: 60})
			require.ErrorAs(t, err, &le)
			assert.Equal(t, "tenant_tokens_per_minute", capName)
			assert.Less(t, le.RetryAfter, 59*time.Second, "the org's 50 leave its minute at 60 s")
		})
	}
}
