package slots

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/inflight-go/inflight/internal/core"
)

// Priority is a waiter's class. When capacity frees, the waiters of the
// highest class that may take it go first (see WithShare for the classes'
// guaranteed parts); within a class, flows take turns (WithFlow); within a
// flow, callers are served in arrival order.
//
// The set is fixed: PriorityInteractive, PriorityDefault and PriorityBatch.
// A value above PriorityInteractive counts as interactive and one below
// PriorityBatch as batch. The zero value is PriorityDefault, which is what a
// caller without WithPriority gets.
type Priority int8

const (
	PriorityBatch       Priority = -1 // background work that may wait
	PriorityDefault     Priority = 0
	PriorityInteractive Priority = 1 // a person is waiting for the answer
)

func (p Priority) class() uint8 { return core.ClassOf(int8(p)) }

// String returns "interactive", "default" or "batch".
func (p Priority) String() string {
	switch p.class() {
	case core.ClassHigh:
		return "interactive"
	case core.ClassLow:
		return "batch"
	}
	return "default"
}

// ErrBadPriority: a priority name is not one of the set (ParsePriority).
// HTTPStatus maps it to 400 Bad Request.
var ErrBadPriority = errors.New("slots: unknown priority")

// ParsePriority parses "interactive", "default" or "batch" (any case, and ""
// for default), for example from an X-Priority header. Anything else fails
// with an error wrapping ErrBadPriority.
func ParsePriority(s string) (Priority, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "interactive":
		return PriorityInteractive, nil
	case "", "default":
		return PriorityDefault, nil
	case "batch":
		return PriorityBatch, nil
	}
	return PriorityDefault, fmt.Errorf("%w %q (want interactive, default or batch)", ErrBadPriority, s)
}

// The request headers PlaceFromHeaders reads. A server that names the flow
// otherwise (an org or API-key header of its own) places requests with
// WithFlow instead.
const (
	HeaderPriority = "X-Priority" // interactive, default or batch
	HeaderFlow     = "X-Flow"     // the flow: the tenant, org or API key the request is for
)

// PlaceFromHeaders returns ctx carrying the priority and the flow that a
// request's headers ask for: HeaderPriority (see ParsePriority) and
// HeaderFlow (weight 1). A header that is absent leaves what ctx carries. A
// priority that does not parse fails with an error wrapping ErrBadPriority.
//
// Clients choose these headers: trust them only from callers you have
// authenticated, or set the place from your own records instead (WithFlow,
// WithPriority). AdmitByHeaders makes an AdmitFunc of it.
func PlaceFromHeaders(ctx context.Context, h http.Header) (context.Context, error) {
	if v := h.Get(HeaderPriority); v != "" {
		p, err := ParsePriority(v)
		if err != nil {
			return ctx, err
		}
		ctx = WithPriority(ctx, p)
	}
	if id := h.Get(HeaderFlow); id != "" {
		ctx = WithFlow(ctx, id)
	}
	return ctx, nil
}

// WithPriority returns a copy of ctx whose waits are in class p. Acquire
// reads it when it has to wait (and, on a limiter with shares, always).
func WithPriority(ctx context.Context, p Priority) context.Context {
	pl := core.PlaceOf(ctx)
	pl.Class = p.class()
	return core.WithPlace(ctx, pl)
}

// PriorityFrom returns the priority ctx carries (PriorityDefault if none).
func PriorityFrom(ctx context.Context) Priority {
	switch core.PlaceOf(ctx).Class {
	case core.ClassHigh:
		return PriorityInteractive
	case core.ClassLow:
		return PriorityBatch
	}
	return PriorityDefault
}

// WithFlow returns a copy of ctx whose waits belong to flow id, for example
// an org or an API key. Within a class, the flows with waiters take turns,
// one grant each, so one flow's backlog cannot hold back another flow's
// single request; within a flow, callers are served in arrival order.
// Callers without a flow share the flow "".
func WithFlow(ctx context.Context, id string) context.Context {
	return WithFlowWeight(ctx, id, 1)
}

// WithFlowWeight is WithFlow with a weight: while flows are backlogged, each
// turn of this flow takes weight grants (deficit round robin), so flows
// weighted 3 and 1 are admitted 3:1. A weight below 1 counts as 1. A flow's
// weight is that of its latest waiter.
func WithFlowWeight(ctx context.Context, id string, weight int) context.Context {
	pl := core.PlaceOf(ctx)
	pl.Flow = id
	pl.Weight = int32(min(max(weight, 1), 1<<20))
	return core.WithPlace(ctx, pl)
}

// FlowFrom returns the flow ctx carries ("" if none) and its weight.
func FlowFrom(ctx context.Context) (id string, weight int) {
	pl := core.PlaceOf(ctx)
	return pl.Flow, max(int(pl.Weight), 1)
}

// AdmitByHeaders returns an AdmitFunc that places each request by its
// headers (PlaceFromHeaders) and admits it with acquire, for example a
// Limiter's Acquire:
//
//	tr := slots.NewTransport(nil, slots.AdmitByHeaders(lim.Acquire))
//
// A request with a bad X-Priority is not sent; RoundTrip returns the error
// (HTTPStatus maps it to 400).
func AdmitByHeaders(acquire func(context.Context) (*Slot, error)) AdmitFunc {
	return func(r *http.Request) (*Slot, error) {
		ctx, err := PlaceFromHeaders(r.Context(), r.Header)
		if err != nil {
			return nil, err
		}
		return acquire(ctx)
	}
}

// Share is the part of a limit guaranteed to one priority class.
//
// Min slots are kept from the other classes while the class has waiters:
// when a slot frees and the class holds fewer than Min, the slot goes to it
// before any higher class. While it has no waiters its Min is lent to
// whoever waits. Reserved slots are kept from the other classes even while
// the class is idle: they are lent to nobody but a higher class that holds
// less than its own guarantee.
//
// When the guarantees add up to more than the limit, they are met from the
// highest class down and the lower ones get what is left; an idle class's
// Min takes no part in that.
//
// A caller counts as waiting in every queue it is in for as long as it
// waits, also while it cannot be served yet (another key of a registry's
// AcquireAll is full, or a pacing Gate's model is full or not due): its
// class keeps its Min in the other queues meanwhile.
type Share struct {
	Min      int
	Reserved int
}

// WithShare guarantees class p the share s of the limit (see Share). For
// example WithShare(PriorityBatch, Share{Min: 1}) keeps batch work moving
// under any interactive load, and WithShare(PriorityInteractive,
// Share{Reserved: 1}) keeps one slot for interactive callers. With shares,
// Acquire reads the priority from the context on every call (TryAcquire
// admits as PriorityDefault). It panics if a count is negative.
func WithShare(p Priority, s Share) Option {
	shareCheck("slots", s)
	return optionFunc(func(w *core.Policy) { w.SetShare(p.class(), s.Min, s.Reserved) })
}

func shareCheck(pkg string, s Share) {
	if s.Min < 0 || s.Reserved < 0 {
		panic(fmt.Sprintf("%s: negative share %+v", pkg, s))
	}
}

// WithMaxQueuePerFlow bounds how many callers of one flow (WithFlow) may wait
// at once: the flow's newest caller beyond n is rejected with ErrQueueFull
// while other flows still queue. Callers without a flow form the flow "", so
// without flows it bounds the whole queue. As with WithMaxQueue, n = 0 means
// no caller waits; the default is no bound, and a negative n restores it.
func WithMaxQueuePerFlow(n int) Option {
	return optionFunc(func(w *core.Policy) { w.MaxFlowQueue, w.BoundFlowQueue = n, n >= 0 })
}

// QueueStats describes who waits, bounded: the waiters per class and the
// flows with the most waiters.
type QueueStats struct {
	Waiting                     int
	Interactive, Default, Batch int        // waiting per class
	TopFlows                    []FlowStat // at most TopFlowsMax, most waiting first
}

// FlowStat is one flow's number of waiters.
type FlowStat struct {
	Flow    string
	Waiting int
}

// TopFlowsMax bounds QueueStats.TopFlows.
const TopFlowsMax = 10

// queueStats builds QueueStats from a queue.
func queueStats(q *core.Queue) QueueStats {
	by, top := q.Top(TopFlowsMax)
	st := QueueStats{Waiting: q.Len(), Interactive: by[core.ClassHigh], Default: by[core.ClassDefault], Batch: by[core.ClassLow]}
	for _, f := range top {
		st.TopFlows = append(st.TopFlows, FlowStat(f))
	}
	return st
}
