// Package slots caps how many operations are in flight at once, with
// RAII-style handles.
//
// A Limiter is one pool. Acquire waits for a free Slot, TryAcquire never
// waits, and the Slot holds its capacity until it is released:
//
//	s, err := lim.Acquire(ctx)
//	if err != nil {
//		return err // a *LimitError, or the context's error
//	}
//	defer s.Release()
//
// NewTransport holds each request's slot until its response body is read
// to the end or closed (a whole stream); Middleware a handler's run,
// WrapBody any body's. Package registry caps per key with the same *Slot.
//
// A Slot must not be copied. Release may be called from any goroutine, any
// number of times; only the first frees capacity. Time never frees a slot.
// A refusal is a *LimitError (errors.Is: ErrLimitReached, ErrQueueFull,
// ErrWaitTimeout, ErrExceedsLimit) with a RetryAfter; HTTPStatus maps it.
//
// # Who goes next
//
// When capacity frees, the highest priority class that may take it goes
// first (WithPriority; WithShare guarantees a class its part, see Share);
// within a class, flows take turns by weight (WithFlow: an org, an API
// key); within a flow, arrival order. Without classes and flows the queue
// is plain FIFO, at its cost. Every queue of the module follows this rule.
// AcquireN weighs a caller in units (a prompt's tokens): flows share units
// by weight; callers pass one whose units do not fit up to 4 times them
// (other flows: half), then it goes first.
package slots
