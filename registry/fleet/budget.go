package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
)

// Budget is a token budget per minute that every process of a fleet
// shares, kept in its store: what the requests started in any minute
// cost, across the fleet, as pacing.Budget counts it in one process (the
// same window of 60 seconds and the current one, on the store's clock; a
// budget's first request passes, however large). Like pacing.Budget it
// never makes a request wait: Reserve takes a request now or refuses it
// with when the budget will take it. Create one with NewBudget; it holds
// no goroutine and needs no Close.
type Budget struct {
	store   driver.Store
	key     string
	limits  [3]int64
	timeout time.Duration

	// The requests this process refused and told when to come back, not
	// yet due: a later refusal is told to come back after them, spread
	// over the refill, not with them.
	mu   sync.Mutex // guards told, sent and the fields after it
	told []toldBudget
	// The budget's parts as the store's latest answer here counted them,
	// when it came, and which it was: the store's time in it (ms), then the
	// order its call was sent in (sent counts them). An answer that overtook
	// an earlier one is not undone by it.
	sent    uint64
	used    [3]int64
	usedAt  time.Time
	usedNow int64
	usedSeq uint64
}

// BudgetStatus is a fleet Budget as the store's latest answer to this
// process counted it, for metrics: each part (all tokens, input, output)
// of Limits (0: none) and what is Left of it over the last minute (below 0
// in debt), At the time of that answer. Other processes' requests since
// then are not in it. With no answer yet (At zero), or none in the last
// minute and a second, all of it is left: what was counted has left the
// window since.
type BudgetStatus struct {
	Left, Limits [3]int
	At           time.Time
}

// Status returns the budget as the store's last answer here counted it.
func (b *Budget) Status() BudgetStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := BudgetStatus{At: b.usedAt}
	stale := time.Since(b.usedAt) > time.Duration(driver.BudgetSteps+1)*time.Second
	for i, l := range b.limits {
		st.Limits[i] = int(l)
		if l > 0 {
			st.Left[i] = int(l)
			if !stale {
				st.Left[i] -= int(b.used[i])
			}
		}
	}
	return st
}

type toldBudget struct {
	due  time.Time
	cost [3]int64
}

// spread returns the wait to tell a request refused with cost when the
// store says the budget takes it after after: later by the time that the
// requests told before it, still to come back, take of the budget's
// refill (a minute for each limit's worth), and records it.
func (b *Budget) spread(cost [3]int64, after time.Duration) time.Duration {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	i := 0
	for i < len(b.told) && !b.told[i].due.After(now) {
		i++
	}
	b.told = b.told[i:]
	var more time.Duration
	for p, l := range b.limits {
		if l <= 0 {
			continue
		}
		var ahead int64
		for _, t := range b.told {
			ahead += t.cost[p]
		}
		more = max(more, time.Duration(float64(ahead)/float64(l)*float64(time.Minute)))
	}
	after += more
	if len(b.told) < maxTold {
		// Mostly in the order due, each told later than the last; one due
		// out of order is dropped with those before it, a little late.
		b.told = append(b.told, toldBudget{due: now.Add(after), cost: cost})
	}
	return after
}

// maxTold bounds the refused requests a Budget spreads.
const maxTold = 4096

// DefaultBudgetTimeout bounds each of a Budget's calls to the store.
const DefaultBudgetTimeout = 500 * time.Millisecond

// NewBudget returns the fleet's budget named name on store (every process
// that names it so shares it), with limits. The limits are each
// process's to say: processes should agree. A timeout of 0 is
// DefaultBudgetTimeout.
func NewBudget(store driver.Store, name string, limits upstream.BudgetLimits, timeout time.Duration) (*Budget, error) {
	if store == nil {
		return nil, errors.New("fleet: NewBudget: nil store")
	}
	if err := validOverrideName(name); err != nil {
		return nil, fmt.Errorf("fleet: budget %w", err)
	}
	if err := upstream.CheckBudgets("", limits); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = DefaultBudgetTimeout
	}
	return &Budget{store: store, key: name, timeout: timeout,
		limits: [3]int64{int64(limits.TokensPerMinute), int64(limits.InputTokensPerMinute), int64(limits.OutputTokensPerMinute)}}, nil
}

// BudgetReservation is what a request took of a fleet's Budget: settle it
// with what the request used, or cancel it.
type BudgetReservation struct {
	b    *Budget
	cost [3]int64
	step int64
	used [3]int64 // the budget's parts after the charge
	done bool
}

// Left returns, per part (all, input, output), what the budget had left
// in its last minute once this reservation was charged, and its limits (0:
// none).
func (r *BudgetReservation) Left() (left, limits [3]int) {
	for i := range left {
		left[i], limits[i] = int(r.b.limits[i]-r.used[i]), int(r.b.limits[i])
	}
	return left, limits
}

// Reserve charges t, a request's estimated cost, if the budget takes it
// now; else it charges nothing and returns a *slots.LimitError wrapping
// pacing.ErrOverBudget, whose Cap names the binding budget, InFlight and
// Limit its tokens in the last minute and its limit, and RetryAfter when
// it will take t: the store's answer, later by the refill that the
// requests this process refused before, and told to come back sooner,
// will take, so that refused clients come back spread out. When the store
// cannot be reached (or takes longer than
// the timeout) it returns an error wrapping ErrUnavailable, and what
// follows is the caller's to choose. t is checked as pacing.Budget's
// Reserve checks it.
func (b *Budget) Reserve(ctx context.Context, t upstream.Tokens) (*BudgetReservation, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	cost := [3]int64{int64(t.Input) + int64(t.Output), int64(t.Input), int64(t.Output)}
	res, err := b.call(ctx, &driver.BudgetCall{Key: b.key, Limits: b.limits, Cost: cost})
	if err != nil {
		return nil, err
	}
	if !res.Charged {
		i := min(max(res.Binding, 0), len(b.limits)-1)
		var after time.Duration
		if res.At > res.Now {
			after = time.Duration(res.At-res.Now) * time.Millisecond
		}
		return nil, &slots.LimitError{Err: upstream.ErrOverBudget, Key: b.key, Cap: upstream.BudgetCap(i),
			InFlight: int(res.Used[i]), Limit: int(b.limits[i]), RetryAfter: b.spread(cost, max(after, time.Millisecond))}
	}
	return &BudgetReservation{b: b, cost: cost, step: res.Step, used: res.Used}, nil
}

// Start moves the reservation's charge to the second its request starts
// in, for a request that may have waited (in a queue) since Reserve: the
// budget counts a request when it starts, as the upstream does. It is one
// store call, atomic; if it fails, the charge stays where it was. Call it
// before Settle, from the goroutine that settles.
func (r *BudgetReservation) Start(ctx context.Context) error {
	if r == nil || r.done {
		return nil
	}
	res, err := r.b.call(ctx, &driver.BudgetCall{Key: r.b.key, Limits: r.b.limits, Cost: r.cost, Correct: true, Move: true, Step: r.step})
	if err != nil {
		return err
	}
	r.step = res.Step
	return nil
}

// Settle corrects the reservation with what the request used: an
// overestimate is returned, an underestimate charged as debt. Only the
// first Settle or Cancel counts (call them from one goroutine); a nil
// reservation does nothing. It returns the store's error, after which the
// estimate stands.
func (r *BudgetReservation) Settle(ctx context.Context, used upstream.Tokens) error {
	in, out := int64(min(max(used.Input, 0), slots.MaxUnits)), int64(min(max(used.Output, 0), slots.MaxUnits))
	return r.correct(ctx, [3]int64{in + out, in, out})
}

// Cancel returns the whole reservation: the request was refused, or never
// sent.
func (r *BudgetReservation) Cancel(ctx context.Context) error { return r.correct(ctx, [3]int64{}) }

func (r *BudgetReservation) correct(ctx context.Context, used [3]int64) error {
	if r == nil || r.done {
		return nil
	}
	r.done = true
	var d [3]int64
	for i := range d {
		d[i] = used[i] - r.cost[i]
	}
	if d == [3]int64{} {
		return nil
	}
	_, err := r.b.call(ctx, &driver.BudgetCall{Key: r.b.key, Limits: r.b.limits, Cost: d, Correct: true, Step: r.step})
	return err
}

// Used returns the tokens started in the budget's last minute, per part
// (all, input, output), as the store counts them now.
func (b *Budget) Used(ctx context.Context) ([3]int, error) {
	res, err := b.call(ctx, &driver.BudgetCall{Key: b.key, Limits: b.limits, Correct: true, Step: -1})
	if err != nil {
		return [3]int{}, err
	}
	return [3]int{int(res.Used[0]), int(res.Used[1]), int(res.Used[2])}, nil
}

// call makes c on the store within the timeout.
func (b *Budget) call(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	cctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	b.mu.Lock()
	b.sent++
	seq := b.sent
	b.mu.Unlock()
	res, err := b.store.Budget(cctx, c)
	if err == nil {
		b.mu.Lock()
		if res.Now > b.usedNow || res.Now == b.usedNow && seq > b.usedSeq {
			b.used, b.usedAt, b.usedNow, b.usedSeq = res.Used, time.Now(), res.Now, seq
		}
		b.mu.Unlock()
	}
	if err != nil {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if errors.Is(err, driver.ErrBadReply) {
			return res, fmt.Errorf("fleet: budget %q: %w", b.key, err)
		}
		return res, fmt.Errorf("%w: budget %q: %v", ErrUnavailable, b.key, err)
	}
	return res, nil
}
