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

// Budget is a budget per minute that every process of a fleet shares,
// kept in its store: what the requests started in any minute cost (their
// tokens, and the requests themselves with MaxRequestsPerMinute), across
// the fleet, as pacing.Budget counts it in one process (the same window
// of 60 seconds and the current one, on the store's clock; a budget's
// first request passes, however large). Like pacing.Budget it never makes
// a request wait: Reserve takes a request now or refuses it with when the
// budget will take it. Create one with NewBudget; it holds no goroutine
// (but for a charge whose caller's context ended before the store
// answered: it waits for the answer, and takes back what the store
// charged, each within the timeout) and needs no Close. Its calls take a
// nil context as context.Background().
//
// The store keeps a budget as up to two records (driver.BudgetCall): its
// tokens under its name, and its requests, when MaxRequestsPerMinute is
// set, under its name followed by requestsKey. A request is charged on
// each in turn, and a refusal by the second takes back the first's
// charge: until it does, another process may count the first (it may be
// refused for it, never admitted over the budget). A refusal by the
// first asks the second when it would take the request (a check, which
// charges nothing): the request is told to come back when both do.
type Budget struct {
	store   driver.Store
	key     string
	limits  [upstream.BudgetParts]int64
	timeout time.Duration

	// The requests this process refused and told when to come back, not
	// yet due: a later refusal is told to come back after them, spread
	// over the refill, not with them.
	mu   sync.Mutex // guards told, sent and seen
	told []toldBudget
	// Each record as the store's latest answer here counted it, when it
	// came, and which it was: the store's time in it (ms), then the order
	// its call was sent in (sent counts them). An answer that overtook an
	// earlier one is not undone by it.
	sent uint64
	seen [2]seenRecord
}

// A Budget's records in the store: its tokens (parts all, input,
// output), and its requests (part all: one per request).
const (
	tokensRecord   = 0
	requestsRecord = 1
)

// requestsKey follows a budget's name in the key of its requests' record:
// a byte no name holds (a name is UTF-8), so no budget's name is another's
// requests record.
const requestsKey = "\xffrequests"

type seenRecord struct {
	used [3]int64
	at   time.Time
	now  int64
	seq  uint64
}

// BudgetStatus is a fleet Budget as the store's latest answers to this
// process counted it, for metrics: each part (all tokens, input, output,
// requests; see pacing.BudgetCap) of Limits (0: none) and what is Left of
// it over the last minute (below 0 in debt), At the time of the latest of
// those answers. Other processes' requests since then are not in it. With
// no answer yet (At zero), or none in the last minute and a second, all
// of it is left: what was counted has left the window since.
type BudgetStatus struct {
	Left, Limits [upstream.BudgetParts]int
	At           time.Time
}

// Status returns the budget as the store's last answers here counted it.
func (b *Budget) Status() BudgetStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	var st BudgetStatus
	used := b.usedLocked(time.Now())
	for i, l := range b.limits {
		st.Limits[i] = int(l)
		if l > 0 {
			st.Left[i] = int(l - used[i])
		}
	}
	for _, r := range b.seen {
		if r.at.After(st.At) {
			st.At = r.at
		}
	}
	return st
}

// usedLocked returns each part's count at the store's latest answers, 0
// for a record with none in the last minute and a second.
func (b *Budget) usedLocked(now time.Time) (used [upstream.BudgetParts]int64) {
	for rec, r := range b.seen {
		if now.Sub(r.at) > time.Duration(driver.BudgetSteps+1)*time.Second {
			continue
		}
		setParts(&used, rec, r.used)
	}
	return used
}

// setParts sets in parts (all tokens, input, output, requests) the counts
// of record rec, as the store keeps them.
func setParts(parts *[upstream.BudgetParts]int64, rec int, counts [3]int64) {
	if rec == requestsRecord {
		parts[upstream.BudgetParts-1] = counts[0]
	} else {
		copy(parts[:3], counts[:])
	}
}

type toldBudget struct {
	due  time.Time
	cost [upstream.BudgetParts]int64
}

// spread returns the wait to tell a request refused with cost when the
// store says the budget takes it after after: later by the time that the
// requests told before it, still to come back, take of the budget's
// refill (a minute for each limit's worth), and records it.
func (b *Budget) spread(cost [upstream.BudgetParts]int64, after time.Duration) time.Duration {
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
			ahead += min(t.cost[p], l) // a request larger than the budget needs one empty minute
		}
		ahead = min(ahead, toldBudgets*l)
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

// toldBudgets bounds the returns told that a refusal counts ahead of it to
// this many budgets' worth (minutes of refill), as pacing's budgets do: a
// caller that asks again without waiting books a return each time.
const toldBudgets = 8

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
	b := &Budget{store: store, key: name, timeout: timeout}
	for i, l := range limits.Parts() {
		b.limits[i] = int64(l)
	}
	return b, nil
}

// uses reports whether the budget keeps record rec: its requests' when
// MaxRequestsPerMinute is set; its tokens' when a token budget is, or
// when no budget is (then it only counts).
func (b *Budget) uses(rec int) bool {
	if rec == requestsRecord {
		return b.limits[upstream.BudgetParts-1] > 0
	}
	return b.limits[0] > 0 || b.limits[1] > 0 || b.limits[2] > 0 || !b.uses(requestsRecord)
}

// callOf returns the call on record rec for cost (a request's charges),
// as a charge; the caller sets the correction's fields.
func (b *Budget) callOf(rec int, cost [upstream.BudgetParts]int64) *driver.BudgetCall {
	if rec == requestsRecord {
		return &driver.BudgetCall{Key: b.key + requestsKey, Limits: [3]int64{b.limits[3]}, Cost: [3]int64{cost[3]}}
	}
	return &driver.BudgetCall{Key: b.key, Limits: [3]int64(b.limits[:3]), Cost: [3]int64(cost[:3])}
}

// Reserve charges t, a request's estimated cost, and the request itself
// (MaxRequestsPerMinute), if the budget takes them now; else it charges
// nothing and returns a *slots.LimitError wrapping pacing.ErrOverBudget,
// whose Cap names the binding budget, InFlight and Limit what it counted
// in the last minute and its limit, and RetryAfter when it will take t:
// the store's answer, later by the refill that the requests this process
// refused before, and told to come back sooner, will take (each at most a
// budget, eight budgets in all), so that refused clients come back spread
// out. When the store cannot be reached
// (or takes longer than the timeout) it returns an error wrapping
// ErrUnavailable, and what follows is the caller's to choose. t is checked
// as pacing.Budget's Reserve checks it: zero Tokens are a request whose
// tokens nobody counts, charged to the requests budget alone.
func (b *Budget) Reserve(ctx context.Context, t upstream.Tokens) (*BudgetReservation, error) {
	if err := t.CheckCharge(); err != nil {
		return nil, err
	}
	if ctx == nil {
		ctx = context.Background() // as call takes it; the refusal's take-back below needs one
	}
	r := &BudgetReservation{b: b, cost: upstream.Charge(t)}
	for rec := range r.charged {
		if !b.uses(rec) {
			continue
		}
		if rec == tokensRecord && t == (upstream.Tokens{}) { // not charged: as this process last saw it
			b.mu.Lock()
			r.used = b.usedLocked(time.Now())
			b.mu.Unlock()
			continue
		}
		res, err := b.chargeCall(ctx, rec, b.callOf(rec, r.cost))
		if err == nil && !res.Charged {
			err = b.refused(ctx, rec, res, r.cost)
		}
		if err != nil {
			// What an earlier record took goes back (with a context of its
			// own: the caller's may have ended); if that fails, it stays
			// charged, as an estimate does.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
			_ = r.Cancel(rctx)
			cancel()
			return nil, err
		}
		r.charged[rec], r.step[rec] = true, res.Step
		setParts(&r.used, rec, res.Used)
	}
	return r, nil
}

// refused is the error of a request that Reserve's charge on record rec
// refused with res. It is told to come back when every record takes it:
// when the tokens' record refuses, the requests' record, not charged yet,
// is asked when it would take the request (a check, which charges
// nothing), and the later time binds. (Told the tokens' time alone, a
// request came back while its requests were still spent, and was refused
// again.) A record that charged the request before takes it now, and a
// window only sheds what it counts as time passes: it needs no check. If
// the check fails, the tokens' answer stands.
func (b *Budget) refused(ctx context.Context, rec int, res driver.BudgetResult, cost [upstream.BudgetParts]int64) error {
	if rec == tokensRecord && b.uses(requestsRecord) {
		if rr, err := b.check(ctx, requestsRecord, cost); err == nil && rr.At-rr.Now > res.At-res.Now {
			rec, res = requestsRecord, rr
		}
	}
	return b.refusal(rec, res, cost)
}

// check asks record rec when it would take cost (a check, which charges
// nothing): At 0 if now. A store that knows no checks (a driver.Store
// written before them) makes it a charge: one it made is taken back, and
// the record took the request now. (It stood for the rest of the minute,
// for a request that was refused.)
func (b *Budget) check(ctx context.Context, rec int, cost [upstream.BudgetParts]int64) (driver.BudgetResult, error) {
	c := b.callOf(rec, cost)
	c.Check = true
	res, err := b.call(ctx, rec, c)
	if err != nil || !res.Charged {
		return res, err
	}
	_ = b.takeBack(context.WithoutCancel(ctx), rec, cost, res.Step) // if that fails, it stays charged, as an estimate does
	res.Charged, res.At, res.Binding = false, 0, 0
	return res, nil
}

// takeBack takes back from record rec the charge of cost made in step (a
// correction).
func (b *Budget) takeBack(ctx context.Context, rec int, cost [upstream.BudgetParts]int64, step int64) error {
	var back [upstream.BudgetParts]int64
	for i, n := range cost {
		back[i] = -n
	}
	c := b.callOf(rec, back)
	c.Correct, c.Step = true, step
	_, err := b.call(ctx, rec, c)
	return err
}

// whenTaken asks b when it would take a request of t, as Reserve charges
// it: each record Reserve would charge is asked (a check, which charges
// nothing), and it returns the one whose time is the later, with its
// answer; -1 if each would take it now, or a store's error left that
// unknown.
func (b *Budget) whenTaken(ctx context.Context, t upstream.Tokens) (int, driver.BudgetResult) {
	by, at := -1, driver.BudgetResult{}
	for rec := range b.seen {
		if !b.uses(rec) || rec == tokensRecord && t == (upstream.Tokens{}) {
			continue
		}
		res, err := b.check(ctx, rec, upstream.Charge(t))
		if err == nil && res.At > res.Now && (by < 0 || res.At-res.Now > at.At-at.Now) {
			by, at = rec, res
		}
	}
	return by, at
}

// refusal is the error of a request that record rec refused with res.
func (b *Budget) refusal(rec int, res driver.BudgetResult, cost [upstream.BudgetParts]int64) *slots.LimitError {
	i := min(max(res.Binding, 0), 2)
	part := i
	if rec == requestsRecord {
		i, part = 0, upstream.BudgetParts-1
	}
	var after time.Duration
	if res.At > res.Now {
		after = time.Duration(res.At-res.Now) * time.Millisecond
	}
	return &slots.LimitError{Err: upstream.ErrOverBudget, Key: b.key, Cap: upstream.BudgetCap(part),
		InFlight: int(res.Used[i]), Limit: int(b.limits[part]), RetryAfter: b.spread(cost, max(after, time.Millisecond))}
}

// Used returns what started in the budget's last minute, per part (all
// tokens, input, output, requests), as the store counts them now.
func (b *Budget) Used(ctx context.Context) ([upstream.BudgetParts]int, error) {
	var parts [upstream.BudgetParts]int64
	for rec := range b.seen {
		if !b.uses(rec) {
			continue
		}
		c := b.callOf(rec, [upstream.BudgetParts]int64{})
		c.Correct, c.Step = true, -1
		res, err := b.call(ctx, rec, c)
		if err != nil {
			return [upstream.BudgetParts]int{}, err
		}
		setParts(&parts, rec, res.Used)
	}
	var used [upstream.BudgetParts]int
	for i, n := range parts {
		used[i] = int(n)
	}
	return used, nil
}

// chargeCall makes c, a charge, on the store within the timeout, on record
// rec, as call does, and returns ctx's error if ctx ends first. The store
// may still make a charge its caller gave up on (it was sent): the call
// goes on, within the timeout, and a charge made is taken back when its
// reply comes, since no request starts for it. (Given up with the call,
// it stood for the rest of the minute: a client that hung up while the
// store was slow to answer cost the budget its estimate.) The price: a
// store slow enough that callers give up still runs their charges, and
// their take-backs after them.
func (b *Budget) chargeCall(ctx context.Context, rec int, c *driver.BudgetCall) (driver.BudgetResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if ctx.Done() == nil {
		return b.call(ctx, rec, c) // it cannot be given up
	}
	if err := ctx.Err(); err != nil {
		return driver.BudgetResult{}, err // not sent
	}
	type reply struct {
		res driver.BudgetResult
		err error
	}
	done := make(chan reply, 1)
	go func() {
		res, err := b.call(context.WithoutCancel(ctx), rec, c)
		done <- reply{res, err}
	}()
	select {
	case r := <-done:
		return r.res, r.err
	case <-ctx.Done():
	}
	select {
	case r := <-done: // it came as ctx ended: the caller takes it
		return r.res, r.err
	default:
	}
	back := *c
	for i, n := range c.Cost {
		back.Cost[i] = -n
	}
	go func() {
		r := <-done
		if r.err != nil || !r.res.Charged {
			return
		}
		back.Correct, back.Step = true, r.res.Step
		_, _ = b.call(context.WithoutCancel(ctx), rec, &back) // if that fails, it stays charged, as an estimate does
	}()
	return driver.BudgetResult{}, ctx.Err()
}

// call makes c on the store within the timeout, on record rec.
func (b *Budget) call(ctx context.Context, rec int, c *driver.BudgetCall) (driver.BudgetResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	cctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	b.mu.Lock()
	b.sent++
	seq := b.sent
	b.mu.Unlock()
	// A panic in the store (a client's, a hook's) is its error, as the
	// Registry's calls have it: a charge runs on a goroutine of its own
	// when the caller's context can end (chargeCall), where it would end
	// the process.
	res, err := safeStore(func() (driver.BudgetResult, error) { return b.store.Budget(cctx, c) })
	if err == nil {
		b.mu.Lock()
		// An answer overtaken by a later call's has a time at most the
		// timeout before that call's (each was made within the timeout
		// of being sent, the later sent after the earlier); a later call's
		// answer with a time earlier still comes from a store whose clock
		// went back, and is the latest count.
		r := &b.seen[rec]
		back := seq > r.seq && res.Now < r.now-b.timeout.Milliseconds()
		if res.Now > r.now || res.Now == r.now && seq > r.seq || back {
			*r = seenRecord{used: res.Used, at: time.Now(), now: res.Now, seq: seq}
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
		// A Budget keeps no record of the store's earlier calls (one is
		// often made per request): the Registry's default probe interval.
		return res, new(outage).refusal(defaultProbeEvery, fmt.Sprintf(": budget %q: %v", b.key, err))
	}
	return res, nil
}
