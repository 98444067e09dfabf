// Package slots caps how many operations are in flight at once, with
// RAII-style handles.
//
// A Limiter is one pool of capacity. Acquire blocks until a Slot is free (in
// arrival order), TryAcquire never waits. Each admission returns a *Slot that
// holds one unit of capacity until it is released:
//
//	s, err := lim.Acquire(ctx)
//	if err != nil {
//		return err // *LimitError, or the context's error
//	}
//	defer s.Release()
//
// In an HTTP client or proxy, NewTransport holds a request's slot until its
// response body is read to the end or closed, so a streamed answer keeps
// it for the whole stream (WrapBody does the same for any body, Middleware
// for a server's handlers).
//
// A Slot must not be copied; always pass *Slot. Release may be called from any
// goroutine; calls after the first do nothing and report false (they are
// counted as misuse in Stats, never turned into extra capacity). Time never
// frees a slot: a Slot held for an hour still counts against the limit.
//
// Rejections are *LimitError values that wrap one of ErrLimitReached,
// ErrQueueFull or ErrWaitTimeout, so errors.Is works; they carry the counts
// at the moment of the decision and a RetryAfter estimate for an HTTP layer.
// A context that ends while waiting yields an error that wraps the context's
// error.
//
// # Who goes next
//
// Every queue of the module (the Limiter's, each registry key's, the pacing
// Gate's) serves its waiters by one rule. A caller's context may carry a
// priority class (WithPriority: interactive, default or batch) and a flow
// (WithFlow, WithFlowWeight: an org, an API key). When capacity frees:
//
//  1. Among the classes whose waiters may take it (below), the highest goes
//     first.
//  2. Within a class, the flows with waiters take turns, weight grants per
//     turn (deficit round robin); a flow that arrives joins the end of the
//     round.
//  3. Within a flow, arrival order.
//
// A caller without a class or a flow is in the default class and the flow
// "", so with neither the queue is plain FIFO, at the cost of plain FIFO;
// choosing the next waiter costs the same with one flow queued or with a
// hundred thousand.
//
// WithShare guarantees a class a part of the limit, so that batch work is
// not starved by interactive work; the rules and the bound on a waiter's
// wait are in the last section, Queue discipline.
//
// WithMaxQueuePerFlow bounds one flow's waiters apart from the whole queue.
// Limiter.Queue (and Registry.Queue, Gate.Status) report the waiters per
// class and the flows with the most waiters. PlaceFromHeaders reads the
// class and the flow from request headers.
//
// # Weights
//
// An admission may weigh what its request costs: AcquireN(ctx, n) and
// TryAcquireN(n) take n units of the limit (the tokens of a prompt, say),
// and the Slot's Release frees exactly those. Limits, InFlight, Stats and
// the shares below then count units; Acquire is AcquireN with n = 1, at
// the same cost. Order stays strict: a waiter that needs n units keeps the
// callers after it (and lower classes) from the units it waits for, so it
// is served as soon as n are free and never starves, at the price of up to
// n-1 units standing idle meanwhile; only a class short of its share
// (WithShare) is served past it, up to what it is owed. With shares, n
// units are admitted exactly when n admissions of one unit in a row would
// be, and what the other classes reserve counts against the most a caller
// can weigh. A caller heavier than the limit could wait forever: it is
// refused with ErrExceedsLimit (HTTPStatus: 413), at once or when the limit
// drops below it while it waits (a limit of 0 is a pause, and refuses
// nobody).
//
// For caps per key (per tenant, per model) see package registry, which hands
// out the same *Slot.
//
// # Queue discipline
//
// Without shares, classes are strict: batch waits while any interactive or
// default caller waits. WithShare gives a class a guaranteed part of the
// limit. Each class c has a guarantee g(c) = max(Min, Reserved), met from the
// highest class down (a lower class gets what the limit leaves). A class
// may take a free slot only if that leaves free what the higher classes are
// owed and, unless it holds less than its own guarantee, what the lower
// classes are owed too; a class is owed what it holds short of g(c) while it
// has waiters, and short of Reserved while it has none. So:
//
//   - A class that holds less than its guarantee and waits gets the next
//     free slot that no higher class is owed, ahead of higher classes. A
//     class with Min m >= 1 therefore always has m slots working while it
//     waits: under any load of higher classes, each release of one of its own
//     slots passes that slot straight to its next waiter, and with holds of
//     equal length it gets m of every limit grants (1 in 4 for Min 1 of 4).
//   - A Reserved part is not lent: other classes leave it free even when its
//     class is idle, except a higher class that holds less than its own
//     guarantee.
//   - Idle Min is lent to whoever waits and is won back as lent slots are
//     released; no holder is ever evicted.
//
// Bound: a waiter that is k-th in its flow, in a class whose queued flows
// weigh W together (the sum of their weights, counting those that join
// while it waits) and whose own flow weighs w, is served within
// ceil(k/w)*(W-w) + k grants of its class: each turn of its flow is
// preceded by at most one turn of every other flow. (The head of a weight-1
// flow behind one other weight-1 flow: within 2 grants.) Grants of its class
// come at least at every release of the class's own slots once it holds its
// Min, or at every grant while it holds less; with Min 0 a lower class can
// wait as long as higher classes keep waiting. The bound is exact for a
// Limiter and for a registry key whose waiters need that key alone; where a
// waiter cannot be served yet (another key of an AcquireAll is full, a
// model of a Gate is not due) the ones after it are served meanwhile; an
// AcquireAll is passed over that way at most registry.MaxPassed times.
package slots
