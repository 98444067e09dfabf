package pacing

import (
	"sync"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/clockx"
	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/slots"
)

// BudgetLimits are budgets per minute, of a Config, a model, an API key
// or a Budget: tokens_per_minute, input_tokens_per_minute,
// output_tokens_per_minute and max_requests_per_minute (see
// upstream.BudgetLimits); 0 leaves one out.
type BudgetLimits = upstream.BudgetLimits

// limitsOf is l indexed as BudgetCap names its parts.
func limitsOf(l BudgetLimits) [budgetParts]int { return l.Parts() }

// Budget is a budget per minute (of tokens, of requests) on its own, for
// a cap that is no Gate's: a tenant's or an API key's, say. It counts what
// the requests started in any minute cost, as a Gate's budgets do, but it
// never makes a request wait: Reserve takes a request now or refuses it
// with the time the budget will have refilled enough. Safe for concurrent
// use; create one with NewBudget.
type Budget struct {
	clk *clockx.Clock
	mu  sync.Mutex
	b   *budgets // never nil: under limits all 0, windows that count still (windowsFor)
}

// NewBudget returns a Budget with those limits. Its clock is the real
// one, unless slots.WithClock gives another (a mock, in tests).
func NewBudget(limits BudgetLimits, opts ...slots.ClockOption) (*Budget, error) {
	return newBudget(limits, clockOf(opts))
}

// newBudget is NewBudget on clk (nil: the real clock).
func newBudget(limits BudgetLimits, clk clock.Clock) (*Budget, error) {
	if err := upstream.CheckBudgets("", limits); err != nil {
		return nil, err
	}
	return &Budget{b: windowsFor(nil, limits), clk: clockx.New(clk)}, nil
}

// windowsFor returns old (new ones if nil) under limits. It is never nil:
// under limits all 0 the windows count still, so that what started in the
// last minute counts when limits come back, and a reservation settles into
// the windows it was charged to.
func windowsFor(old *budgets, limits BudgetLimits) *budgets {
	if b := newBudgets(old, limitsOf(limits)); b != nil {
		return b
	}
	if old == nil {
		old = new(budgets)
	}
	for i := range old.w {
		old.w[i].limit = 0
	}
	return old
}

// setLimits gives b those limits from now on; what started in the last
// minute counts against them.
func (b *Budget) setLimits(limits BudgetLimits) error {
	if err := upstream.CheckBudgets("", limits); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = windowsFor(b.b, limits)
	return nil
}

// clockOf is the clock opts set; nil: the real one.
func clockOf(opts []slots.ClockOption) clock.Clock {
	var s core.Settings
	for _, o := range opts {
		if o != nil {
			o.Apply(&s)
		}
	}
	return s.Policy.Clock
}

// Reservation is what a request took of a Budget: start it when its
// request starts, if it may have waited since; settle it with what the
// request used, or cancel it if the request was never served.
type Reservation struct {
	b       *Budget
	est     Tokens
	step    int64 // guarded by b.mu: the second its charge is counted in
	settled bool  // guarded by b.mu
	started bool  // guarded by b.mu: Start was called; a later one changes nothing
	// refused, guarded by b.mu: Start's refusal (Cap set), after which the
	// reservation charges nothing and each Start returns it again.
	refused slots.LimitError
	owner   ender // told once it ends (Budgets' count of open ones); nil: none
}

// ender is told that a reservation has ended.
type ender interface{ end() }

// Reserve charges t, a request's estimated cost, if the budget takes it
// now: if what started in the last minute and t fit each limit, or if
// nothing did (a budget's first request passes, however large). Else it
// takes nothing and returns a *slots.LimitError wrapping ErrOverBudget,
// whose Cap names the binding budget (CapTokensPerMinute and its parts,
// or CapMaxRequestsPerMinute), InFlight and Limit what it counted in the
// last minute and its limit, and RetryAfter when it will take t. The
// request counts 1 on MaxRequestsPerMinute. t's parts must not be
// negative and its total must be at most slots.MaxUnits (else an error
// wrapping slots.ErrBadUnits); zero Tokens are a request whose tokens
// nobody counts: it charges the requests budget alone.
func (b *Budget) Reserve(t Tokens) (*Reservation, error) {
	if err := t.CheckCharge(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Nanos()
	if at, name := b.b.binding("", t, afterNone, now); at != 0 {
		used, limit := b.b.use(name, now)
		return nil, &slots.LimitError{Err: ErrOverBudget, Cap: name, InFlight: used, Limit: limit, RetryAfter: retryAt(at, now)}
	}
	b.b.charge(t, now)
	return &Reservation{b: b, est: t, step: now / int64(budgetStep)}, nil
}

// Start moves the reservation's charge to the second its request starts
// in, for a request that may have waited since Reserve (for a slot, in a
// queue): the budget counts a request when it starts, as the upstream
// does, and a charge left in the second it was reserved in would leave
// the minute early and let more start in it than the budget. Call it as
// the request is sent, once; a reservation started before, ended or nil
// is not moved again.
//
// A charge that has left the budget's minute meanwhile (its request waited
// longer than that) is charged again only if it fits now, as Reserve
// charges: if it does not, Start returns Reserve's *slots.LimitError
// wrapping ErrOverBudget (and so does each later Start), the reservation
// charges nothing from then on, and its request must not start (Cancel
// it; Settle does nothing either).
func (r *Reservation) Start() error {
	if r == nil {
		return nil
	}
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.refused.Cap != "" {
		le := r.refused // a copy: a caller may name it as its own
		return &le
	}
	if r.settled || r.started {
		return nil
	}
	r.started = true
	now := b.clk.Nanos()
	s := now / int64(budgetStep)
	if s <= r.step { // its second still (or a clock that went back): charged where it is
		return nil
	}
	if s-r.step <= budgetSteps { // still in the minute: moved, unchecked, as it was taken
		b.b.correct(r.step, r.est, Tokens{}, endedMoved, now)
		b.b.charge(r.est, now)
		r.step = s
		return nil
	}
	if at, name := b.b.binding("", r.est, afterNone, now); at != 0 {
		used, limit := b.b.use(name, now)
		r.refused = slots.LimitError{Err: ErrOverBudget, Cap: name, InFlight: used, Limit: limit, RetryAfter: retryAt(at, now)}
		le := r.refused
		return &le
	}
	b.b.charge(r.est, now)
	r.step = s
	return nil
}

// Settle corrects the reservation with what the request used, as the
// upstream reported it: an overestimate is returned, an underestimate
// charged as debt. Only the first Settle or Cancel counts; a nil
// Reservation does nothing. Each part counts within 0..slots.MaxUnits.
func (r *Reservation) Settle(used Tokens) {
	used.Input, used.Output = min(max(used.Input, 0), slots.MaxUnits), min(max(used.Output, 0), slots.MaxUnits)
	r.settle(used, endedUsage)
}

// Cancel returns the whole reservation, its request too: the request was
// refused, or never sent, and charges nothing.
func (r *Reservation) Cancel() { r.settle(Tokens{}, endedUnserved) }

// Close ends the reservation with its estimate standing, unless Settle or
// Cancel ended it before: for a request whose usage is not known (no usage
// in its answer, a failed exchange). A Budgets keeps a key's Budget until
// each of its reservations has ended.
func (r *Reservation) Close() { r.settle(Tokens{}, endedNone) }

// endedNone is the end of a reservation whose estimate stands (Close).
const endedNone = -1

func (r *Reservation) settle(used Tokens, ended int) {
	if r == nil {
		return
	}
	if r.finish(used, ended) && r.owner != nil {
		r.owner.end() // with b.mu released
	}
}

// finish ends r, if nothing has, and reports whether it did.
func (r *Reservation) finish(used Tokens, ended int) bool {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.settled {
		return false
	}
	r.settled = true
	if ended != endedNone && r.refused.Cap == "" {
		b.b.correct(r.step, r.est, used, ended, b.clk.Nanos())
	}
	return true
}

// Status returns the budgets as a Gate's Status does (Model "").
func (b *Budget) Status() []BudgetStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.status(nil, "", "", b.clk.Nanos())
}

// Idle reports whether nothing is counted in the last minute: a Budget
// kept per tenant may be dropped then, and made again when needed.
func (b *Budget) Idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b == nil {
		return true
	}
	now := b.clk.Nanos()
	for i := range b.b.w {
		if b.b.w[i].resetIn(now) > 0 {
			return false
		}
	}
	return true
}
