package pacing

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/inflight-go/inflight/slots"
)

// A Trace is told what a Transport does with one request, on the
// goroutine that sends it (Settled and Released aside), as
// net/http/httptrace's ClientTrace is: for metrics and logs of a server
// that proxies the request. Attach it with WithTrace; any of its functions
// may be nil.
type Trace struct {
	// Waiting is called as the request starts to wait for its admission,
	// once its model is known: its Admission.Wait, and the wait of a
	// refusal that comes after it, are timed from then.
	Waiting func()
	// FleetWait is called as the request starts to take the fleet's caps
	// (WithFleet); the function it returns, if not nil, as that ends.
	FleetWait func() (done func())
	// Admitted is called once the request holds its slots.
	Admitted func(Admission)
	// Refused is called with the refusal of the fleet, the Gate or a
	// budget kept beside it.
	Refused func(err error)
	// Settled is called once for an admitted request (with a slot or
	// without) with how it ended, when the answer tells: not Served for an
	// answer that refused it (a verdict other than Admitted and Other: a
	// 429, an overload; and any 429, its body cut before its kind was
	// told) and for one never sent (its base's error wraps
	// slots.ErrNotSent, it failed to dial, or its context ended before it
	// had a connection), which are then no request of the upstream's and
	// charge nothing; Served with zero Used for a redirect or another 4xx
	// (sent, but nothing used); for a request admitted under
	// WithTokens, Served with the usage its answer reported (WatchUsage).
	// It is not called when none of these is known (a failed exchange, a
	// served request without WithTokens, an answer with no usage): the
	// estimate stands. It may run on the goroutine that reads the answer's
	// body, and should not close that body (a Close there waits 5 s for
	// the report it is part of). A request whose Admitted panicked, or whose credential
	// function (WithCredential) did, is not sent: the Traces told Admitted
	// hear Settled, not Served. For budgets of the caller's own, kept
	// beside the Gate's (a tenant's Budget), use WithBudgets: it starts a
	// reservation as its request is sent, and sends none whose Start is
	// refused, which a hook cannot do.
	Settled func(Settlement)
	// Released is called once an admitted request's slots are free again,
	// with its Admission and how long it held them since Admitted: when
	// its answer's body was read to the end or closed (after
	// WithCutLinger's linger, for a cut exchange), or its exchange failed.
	// It may run on the goroutine that closes the body, or on a timer's.
	// It is not called for a Bypassed admission (fail-open: the Gate's
	// part or the fleet's went ahead without capacity), nor for a Trace
	// whose Admitted was not called (one attached after a Trace whose
	// Admitted panicked). A panic in it is logged and goes no further: the
	// slots are free then, and the other Traces are told all the same.
	Released func(a Admission, held time.Duration)
}

// A Settlement is how an admitted request ended, for budgets (see
// Trace.Settled).
type Settlement struct {
	Served bool   // false: refused by the upstream, or not sent; no request
	Used   Tokens // the usage its answer reported, when Served
}

// An Admission is what a request was admitted with.
type Admission struct {
	Grant Grant       // the Gate's
	Held  *slots.Slot // the Grant's slot and the fleet's, held together
	Wait  time.Duration
}

type traceKey struct{}

// WithTrace returns a context under which a Transport tells tr what it
// does with the request, beside the Traces ctx carries already: each is
// told, in the order they were attached (a metrics adapter's and the
// program's own, say). A nil tr adds nothing.
func WithTrace(ctx context.Context, tr *Trace) context.Context {
	if tr == nil {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, append(slices.Clip(tracesOf(ctx)), tr))
}

// traces are the Traces a request's context carries, in order.
type traces []*Trace

func tracesOf(ctx context.Context) traces {
	trs, _ := ctx.Value(traceKey{}).(traces)
	return trs
}

// fleetWait calls each FleetWait and returns what ends them all (nil:
// nothing to end). If one panics, those that began are ended first.
func (trs traces) fleetWait() (done func()) {
	var dones []func()
	began := false
	defer func() {
		if !began {
			_ = endAll(dones) // the FleetWait's panic goes on, not theirs
		}
	}()
	for _, tr := range trs {
		if tr.FleetWait != nil {
			if d := tr.FleetWait(); d != nil {
				dones = append(dones, d)
			}
		}
	}
	began = true
	if len(dones) == 0 {
		return nil
	}
	return func() {
		if p := endAll(dones); p != nil {
			panic(p)
		}
	}
}

// endAll calls each of dones, also after one panics, and returns the
// first panic's value (nil: none).
func endAll(dones []func()) any { return eachOf(len(dones), func(i int) { dones[i]() }) }

// eachOf calls f(i) for i from 0 to n-1, also after one panics, and returns
// the first panic's value (nil: none).
func eachOf(n int, f func(i int)) (first any) {
	for i := range n {
		func() {
			defer func() {
				if p := recover(); p != nil && first == nil {
					first = p
				}
			}()
			f(i)
		}()
	}
	return first
}

// heard is what the Traces of an admission heard: the Admission, and how
// many of them (the first n) were told it, so that those alone are told
// Released when one of them panics.
type heard struct {
	a Admission
	n int
}

// admitted tells each Trace a, counting those told in *told (and in h,
// if not nil).
func (trs traces) admitted(a Admission, h *heard, told *int) {
	if h != nil {
		h.a = a
	}
	for i, tr := range trs {
		*told = i + 1
		if h != nil {
			h.n = i + 1
		}
		if tr.Admitted != nil {
			tr.Admitted(a)
		}
	}
}

// unsentAfterPanic tells each Trace, told Admitted of a request that a
// panic then kept from being sent, that it was not (Settled, not Served).
// A panic of theirs is logged: the first one goes on.
func (trs traces) unsentAfterPanic(log *slog.Logger) {
	if p := eachOf(len(trs), func(i int) {
		if f := trs[i].Settled; f != nil {
			f(Settlement{})
		}
	}); p != nil {
		log.Error("pacing: a Trace's Settled panicked after a Trace's Admitted did", slog.Any("panic", p))
	}
}

func (trs traces) refused(err error) {
	for _, tr := range trs {
		if tr.Refused != nil {
			tr.Refused(err)
		}
	}
}

func (trs traces) settled(st Settlement) {
	for _, tr := range trs {
		if tr.Settled != nil {
			tr.Settled(st)
		}
	}
}

// hears reports whether one of trs has a function f returns.
func (trs traces) hears(f func(*Trace) bool) bool { return slices.ContainsFunc(trs, f) }

// released tells each Trace a's release, also after one panics (each
// told Admitted hears Released), then goes on with the first panic.
func (trs traces) released(a Admission, held time.Duration) {
	first := eachOf(len(trs), func(i int) {
		if f := trs[i].Released; f != nil {
			f(a, held)
		}
	})
	if first != nil {
		panic(first)
	}
}

// waiting tells each Trace that the request starts to wait.
func (trs traces) waiting() {
	for _, tr := range trs {
		if tr.Waiting != nil {
			tr.Waiting()
		}
	}
}
