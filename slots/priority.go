package slots

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/inflight-go/inflight/internal/core"
)

// Priority is a waiter's class; the zero value is PriorityDefault.
type Priority int8

const (
	PriorityBatch       Priority = -1 // background work that may wait
	PriorityDefault     Priority = 0
	PriorityInteractive Priority = 1 // a person is waiting for the answer
)

func (p Priority) class() uint8 { return core.ClassOf(int8(p)) }

// The priority of each class (core.ClassOf's inverse), and its name (for
// String and ParsePriority).
var (
	priorities    = [core.NumClasses]Priority{core.ClassHigh: PriorityInteractive, core.ClassDefault: PriorityDefault, core.ClassLow: PriorityBatch}
	priorityNames = [core.NumClasses]string{core.ClassHigh: "interactive", core.ClassDefault: "default", core.ClassLow: "batch"}
)

// String returns "interactive", "default" or "batch".
func (p Priority) String() string { return priorityNames[p.class()] }

// ParsePriority parses "interactive", "default" or "batch" (any case).
func ParsePriority(s string) (Priority, error) {
	name := cmp.Or(strings.ToLower(strings.TrimSpace(s)), "default") // none: the default
	if c := slices.Index(priorityNames[:], name); c >= 0 {
		return priorities[c], nil
	}
	return PriorityDefault, fmt.Errorf("%w %q (want interactive, default or batch)", ErrBadPriority, s)
}

// The request headers PlaceFromHeaders reads.
const (
	HeaderPriority = "X-Priority" // interactive, default or batch
	HeaderFlow     = "X-Flow"     // the flow: the tenant, org or API key the request is for
)

// PlaceFromHeaders returns ctx with the priority and flow that h asks for
// (ErrBadPriority for a bad one). Trust it only from authenticated callers.
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

// WithPriority returns a copy of ctx whose waits are in class p.
func WithPriority(ctx context.Context, p Priority) context.Context {
	pl := core.PlaceOf(ctx)
	pl.Class = p.class()
	return core.WithPlace(ctx, pl)
}

// PriorityFrom returns the priority ctx carries (PriorityDefault if none).
func PriorityFrom(ctx context.Context) Priority { return priorities[core.PlaceOf(ctx).Class] }

// WithFlow returns ctx whose waits belong to flow id (an org, an API key).
func WithFlow(ctx context.Context, id string) context.Context { return WithFlowWeight(ctx, id, 1) }

// WithFlowWeight is WithFlow weighted (1 to 1<<20): flows of 3 and 1 go 3:1.
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

// AdmitByHeaders admits a request placed by its headers (PlaceFromHeaders).
func AdmitByHeaders(acquire func(context.Context) (*Slot, error)) AdmitFunc {
	return func(r *http.Request) (*Slot, error) {
		ctx, err := PlaceFromHeaders(r.Context(), r.Header)
		if err != nil {
			return nil, err
		}
		return acquire(ctx)
	}
}

// Share is the part of a limit guaranteed to one priority class; without
// shares, classes are strict and batch waits while anyone else waits.
//
// Min is kept for the class while it waits: a freed slot goes to a class
// holding fewer than its Min before any higher class. An idle class's Min
// is lent, and won back as lent slots are released. Reserved is kept even
// while the class is idle, lent only to a higher class short of its own.
// Guarantees, max(Min, Reserved), are met from the highest class down.
// Bound: the k-th waiter of a flow weighing w, among queued flows weighing
// W, is served within ceil(k/w)*(W-w) + k grants of its class (at one unit
// each; a turn is worth w times about the heaviest waiter's units). A waiter
// that cannot be served yet (an AcquireAll's other key is full) keeps its
// place while those after it go.
type Share struct {
	Min      int
	Reserved int
}

// WithShare guarantees class p share s of the limit; a negative count panics.
func WithShare(p Priority, s Share) Option {
	if s.Min < 0 || s.Reserved < 0 {
		panic(fmt.Sprintf("slots: negative share %+v", s))
	}
	return optionFunc(func(w *core.Policy) { w.SetShare(p.class(), s.Min, s.Reserved) })
}

// WithMaxQueuePerFlow bounds a flow's waiters; 0: none; unset, < 0: no cap.
func WithMaxQueuePerFlow(n int) Option {
	return optionFunc(func(w *core.Policy) { w.MaxFlowQueue, w.BoundFlowQueue = n, n >= 0 })
}

// QueueStats says who waits: per class, and the flows with the most waiters.
type QueueStats struct {
	Waiting                     int
	Interactive, Default, Batch int        // waiting per class
	TopFlows                    []FlowStat // at most 10, most waiting first
}

// FlowStat is one flow's number of waiters.
type FlowStat struct {
	Flow    string
	Waiting int
}
