package pacing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// Gate admits one provider's upstream requests under its Config, all
// controls at once: it grants a request when the provider has a free slot,
// the request's model has one, some API key of the pool has one, and the
// provider's and the model's next start times have come, and takes all of
// them in that one decision. Starts are spaced from the moment of grant.
//
// Waiters are served in arrival order among those that can be served: a
// request for a model whose lane is full or not yet due does not hold back a
// later one for a model that is free. A waiter that gives up takes nothing:
// no slot, and no start.
//
// A request's context may carry a priority class (slots.WithPriority) and a
// flow (slots.WithFlow): then, among the requests that can start, the
// highest class goes first, flows within a class take turns (counted in
// what each request takes of the provider's caps, see AcquireN), and each
// flow is served in arrival order. Config.Shares guarantees classes a part
// of the provider cap.
//
// The Slot of a grant holds the provider, model and key slots together until
// it is released (wrap the response body with slots.WrapBody, or use a
// slots.Transport). Create a Gate with NewGate; the zero value is not usable.
type Gate struct {
	name string
	eng  core.Engine
	clk  clock.Clock // timers for the next start

	mu       sync.Mutex // protects the fields below and the lanes
	cfg      Config
	interval time.Duration // the provider's spacing
	provider core.Lane     // its Waiters are the Gate's one queue
	models   map[string]*modelLane
	keys     []*keyLane // the pool, in the configured order
	keyByID  map[string]*keyLane
	last     int64 // provider's last start, clock nanos; 0 before any
	started  bool
	timer    *clock.Timer // a pending dispatch at timerAt, or nil
	timerAt  int64
	timerGen uint64 // tells a stale timer's callback from the current one's
	isClosed bool   // Close was called: no more grants
	seq      uint64
	rejects  uint64
	bypassed uint64
	ad       adaptive // the learned cap and the upstream's pauses (learn.go)
	tok      tokens   // the provider's tokens in flight (tokens.go)
	bud      *budgets // the provider's token budgets (budget.go), or nil
	// keyBudgets: some key of the pool has token budgets, so a key is
	// picked for the request that starts.
	keyBudgets bool
	retired    map[string]*budgets // budgets taken out by Reconfigure (budgetsForLocked)
	goneKeys   map[string]*keyLane // keys taken out of the pool while requests hold them
}

// grant is the Owner of one admission's hold: its model and key, and its
// places in the provider's, model's and key's holder sets.
type grant struct {
	g     *Gate
	model *modelLane
	key   *keyLane
	idx   [3]int32
	units int32 // the tokens it weighs (AcquireN); beside idx, in its padding
	// The request's estimated cost (cost), and the second it started in:
	// int32s, as a cost's total is at most slots.MaxUnits.
	estIn, estOut int32
	step          int32
	settled       bool // Settle (or a refusal, a give-back) has corrected its charges
	// refused is a waiter's refusal made before Ended reads it: by a lowered
	// token cap (refuseHeavyLocked), or a budget as it timed out (proceedLocked).
	refused *core.Rejection
	n       int // the provider's requests in flight at the start, this one included
	keyN    int // the same for its key
	mN      int // the same for its model
	// The start times as they were before this grant, put back if the grant
	// is given back (its caller's context ended as it came) and no later
	// grant has moved them: a start that never happened takes no interval.
	prev, modelPrev starts
	reported        bool // Report has taken its verdict
	// The budgets the request counts on: while it waits (queue), then
	// those charged once it has started: the provider's, its model's, its
	// key's.
	bud [3]*budgets
}

type starts struct {
	started bool
	last    int64
}

// Grant is an admission: the Slot that holds its capacity and the API key to
// send the request with ("" without a key pool, or for a bypass).
type Grant struct {
	Slot *slots.Slot
	Key  string
	// InFlight is how many of the provider's requests were in flight when
	// this one started, itself included (0 for a bypass): the evidence that
	// Report gives the learned cap.
	InFlight int
	gate     *Gate  // the Gate that granted it; Report ignores another's
	at       int64  // the start, clock nanos
	id       uint64 // the start's number
	keyN     int    // its key's requests in flight at the start, itself included
	model    string
	modelN   int // its model's requests in flight at the start, itself included
}

// A GateOption configures a Gate: slots.WithClock (for tests),
// slots.WithLogger and slots.WithObserver (events for metrics, as a
// Limiter's). How long and how many wait is the Config's (MaxQueue,
// MaxQueueWait, OnWaitTimeout): the wait options of package slots are not
// GateOptions, and do not compile here.
type GateOption = slots.BaseOption

// NewGate returns a Gate for the provider name under cfg, or cfg's
// validation error.
func NewGate(name string, cfg Config, opts ...GateOption) (*Gate, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var st core.Settings
	core.Apply(&st, opts)
	g := &Gate{name: name, models: map[string]*modelLane{}, keyByID: map[string]*keyLane{}, goneKeys: map[string]*keyLane{}}
	g.eng.Policy = core.Policy{Clock: st.Clock, Logger: st.Logger, Observer: st.Observer, Wants: st.Wants}
	g.eng.Init("pacing", func(rej *core.Rejection) error { return (*slots.LimitError)(rej) })
	g.clk = cmp.Or(g.eng.Policy.Clock, clock.New())
	g.applyLocked(cfg)
	return g, nil
}

// ErrGateClosed: the provider was removed (Close) while the request waited,
// or before it came.
var ErrGateClosed = errors.New("pacing: provider removed")

// Reconfigure applies cfg to the live Gate: caps and spacing change at once,
// no holder loses its slot (a lowered cap admits again once enough holders
// have released), and raised caps admit waiters at once. A key dropped from
// the pool gets no new requests; its holders keep it until they release. It
// returns cfg's validation error and changes nothing then.
func (g *Gate) Reconfigure(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var wk core.Wakes
	g.mu.Lock()
	g.applyLocked(cfg)
	g.refuseHeavyLocked(&wk)
	g.redispatchLocked(g.eng.Clock.Nanos(), &wk)
	return nil
}

// Close removes the provider: waiters and later Acquires fail with
// ErrGateClosed, holders keep their slots, and learned caps stop learning.
func (g *Gate) Close() {
	var wk core.Wakes
	g.mu.Lock()
	g.isClosed = true
	g.armLocked(0, 0) // no dispatch is needed any more
	g.stopTimersLocked()
	for _, w := range slices.Collect(g.queuedLocked()) {
		g.unqueueLocked(w)
		wk.Refuse(w) // with no refusal of its own: ended as closed (grant.Ended)
	}
	g.mu.Unlock()
	wk.Wake()
}

// Acquire waits until model's request may start, then grants it. It fails
// with a *slots.LimitError wrapping slots.ErrQueueFull (MaxQueue waiting
// already) or slots.ErrWaitTimeout (waited MaxQueueWait, with on_wait_timeout
// "reject"), or with an error wrapping ctx.Err(). With "proceed", a wait
// that times out returns a Grant whose Slot is Bypassed (see AcquireTokens).
func (g *Gate) Acquire(ctx context.Context, model string) (Grant, error) {
	return g.acquire(ctx, model, Tokens{Input: 1})
}

// acquire is AcquireTokens with t checked.
func (g *Gate) acquire(ctx context.Context, model string, t Tokens) (Grant, error) {
	if err := g.eng.Check(ctx, 1, true); err != nil {
		return Grant{}, err
	}
	gr := &grant{g: g, units: int32(t.Total()), estIn: int32(t.Input), estOut: int32(t.Output)}
	x, h, _ := g.eng.Begin(gr, 1, 0) // no leak detection: never a tracked hold
	place := core.PlaceOf(ctx)
	h.Class = place.Class
	w := core.NewWaiter(h, 0)
	w.Place(place)
	var wk core.Wakes
	g.mu.Lock()
	d, granted := g.decideLocked(ctx, gr, w, model, t, &wk)
	g.mu.Unlock()
	wk.Wake()
	if granted && ctx.Err() != nil {
		// Served at once (its buffered signal is left unread), but the
		// context ended meanwhile: give it back.
		h.GivenBack = true
		h.Release()
		d = core.Cancel()
	}
	x, err := g.eng.Finish(ctx, x, nil, d)
	if err != nil {
		return Grant{}, err
	}
	if h.Bypassed {
		return Grant{Slot: (*slots.Slot)(x)}, nil
	}
	gt := Grant{Slot: (*slots.Slot)(x), InFlight: gr.n, gate: g, at: h.At, id: h.ID, keyN: gr.keyN, model: gr.model.name, modelN: gr.mN}
	if gr.key != nil {
		gt.Key = gr.key.id
	}
	return gt, nil
}

// decideLocked decides for gr's request for model, of cost t, as w: it is
// admitted at once (granted), refused, or waits.
func (g *Gate) decideLocked(ctx context.Context, gr *grant, w *core.Waiter, model string, t Tokens, wk *core.Wakes) (d core.Decision, granted bool) {
	// Whether the context has ended is decided under the lock, with the
	// admission (see slots.Limiter.Acquire).
	switch {
	case core.Ended(ctx):
		return core.Cancel(), false
	case g.isClosed:
		return core.Fail(ErrGateClosed, g.closedError()), false
	}
	// Read under the lock: Reconfigure may change g.cfg while this caller
	// waits without it.
	now := g.eng.Clock.Nanos()
	queueWait := g.cfg.QueueWait()
	w.Hold.At, w.Start, w.MaxWait = now, now, queueWait // w.Hold.At is the grant's once queued
	n := t.Total()
	if gr.model = g.models[model]; gr.model == nil { // an unconfigured model: no cap, no spacing
		gr.model = &modelLane{name: model, lane: core.Lane{Limit: slots.Unlimited}}
		g.models[model] = gr.model
	}
	if name, _, _ := g.tooHeavyLocked(gr.model, n); name != "" {
		rej := g.exceedsLocked(gr.model, n)
		g.dropIfIdleLocked(gr.model)
		return core.Refuse(rej), false
	}
	if rej := g.overBudgetLocked(gr.model, t, afterQueued, queueWait, now); rej != nil {
		g.dropIfIdleLocked(gr.model)
		return core.Refuse(rej), false
	}
	w.Cost = g.turnCostLocked(n)
	g.provider.Waiters.Push(&w.Elem)
	gr.queue()
	g.dispatchLocked(now, wk)
	if w.State == core.Granted {
		return core.Admit(), true
	}
	if g.provider.Waiters.Len() > g.cfg.QueueLimit() ||
		g.cfg.MaxQueuePerFlow != nil && g.provider.Waiters.FlowLen(w.Flow) > *g.cfg.MaxQueuePerFlow {
		// The queue (or the caller's flow) was full and this request
		// cannot start now: the newest is turned away (one that can start
		// is never queued).
		g.unqueueLocked(w)
		rej := g.rejectLocked(slots.ErrQueueFull, gr.model, t, w.Class, now)
		// Its class may have stopped waiting, and stopped keeping its
		// minimum share from the others; a request waiting for tokens
		// that leaves stops holding back the ones after it.
		g.dispatchLocked(now, wk)
		return core.Refuse(rej), false
	}
	return core.Wait(w, gr), false
}

// closedError is the error of a request to a Gate that was closed.
func (g *Gate) closedError() error { return fmt.Errorf("%w: %s", ErrGateClosed, g.name) }

// Withdraw implements core.Waits: it takes gr's waiter out of the queue if
// it is still waiting.
func (gr *grant) Withdraw(w *core.Waiter) bool { return gr.g.withdraw(w) }

// Ended implements core.Waits: a wait that took nothing.
func (gr *grant) Ended(w *core.Waiter, out core.Outcome) core.Ending {
	g := gr.g
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case out == core.OutCanceled:
		return core.Ending{}
	case out == core.OutDeadline: // told as if it had timed out, below
		g.rejects-- // which rejectLocked counts: this one is a cancellation
	case out == core.OutRefused && gr.refused == nil: // by Close
		return core.Ending{Reason: ErrGateClosed, Err: g.closedError()}
	case out != core.OutRefused && g.cfg.FailOpen() && g.proceedLocked(gr): // as configured now; unless a budget holds it back
		return core.Ending{Bypass: "provider", Attrs: []slog.Attr{slog.String("provider", g.name), slog.String("model", gr.model.name)}}
	case gr.refused != nil: // a token cap was lowered below it, or a budget holds it back
		g.dropIfIdleLocked(gr.model)
		return core.Ending{Rej: gr.refused} // made when it was refused
	}
	return core.Ending{Rej: g.rejectLocked(slots.ErrWaitTimeout, gr.model, gr.cost(), w.Class, g.eng.Clock.Nanos())}
}

// withdraw takes w out of the queue if it is still waiting: it took nothing.
func (g *Gate) withdraw(w *core.Waiter) bool {
	var wk core.Wakes
	g.mu.Lock()
	defer wk.Wake() // deferred first, so it runs after the unlock
	defer g.mu.Unlock()
	// A waiter whose turn comes at the very moment its wait ends (as a
	// client that honoured a budget's Retry-After does) starts.
	if now := g.eng.Clock.Nanos(); g.timer != nil && g.timerAt <= now {
		g.dispatchLocked(now, &wk)
	}
	if w.State != core.Waiting {
		return false
	}
	g.unqueueLocked(w)
	// A class that stops waiting stops keeping its minimum share from the
	// others, and a request waiting for tokens stops holding back the ones
	// after it: they may now start.
	g.dispatchLocked(g.eng.Clock.Nanos(), &wk)
	return true
}

// unqueueLocked takes w out of the queue, Gone (a refusal then marks it
// Refused): it took nothing, and its model goes if nothing else uses it.
func (g *Gate) unqueueLocked(w *core.Waiter) {
	g.provider.Waiters.Remove(&w.Elem)
	w.State = core.Gone
	gr := w.Hold.Owner.(*grant)
	gr.unqueue()
	g.dropIfIdleLocked(gr.model)
}

// Release implements core.Owner: it frees the provider, model and key slots.
func (gr *grant) Release(h *core.Hold) bool {
	g := gr.g
	var wk core.Wakes
	g.mu.Lock()
	if !g.provider.Remove(h, &gr.idx[0]) {
		g.mu.Unlock()
		gr.Misuse(h) // a copied Slot: it holds nothing
		return false
	}
	gr.model.lane.Remove(h, &gr.idx[1])
	g.tok.held -= int(gr.units)
	gr.model.tok.held -= int(gr.units)
	if gr.key != nil {
		gr.key.lane.Remove(h, &gr.idx[2])
	}
	if h.GivenBack {
		g.unsentLocked(gr, h.ID, h.At)
	}
	g.dispatchLocked(g.eng.Clock.Nanos(), &wk)
	g.dropIfIdleLocked(gr.model)
	g.mu.Unlock()
	wk.Wake()
	g.eng.Released(h)
	return true
}

// Misuse implements core.Owner.
func (gr *grant) Misuse(h *core.Hold) { gr.g.eng.Misuse(h) }

// Time implements core.Owner.
func (gr *grant) Time(at int64) time.Time { return gr.g.eng.Clock.Time(at) }

// Log implements core.Owner.
func (gr *grant) Log() *slog.Logger { return gr.g.eng.Log() }
