package pacing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/httpx"
	"github.com/inflight-go/inflight/slots"
)

// Transport is the provider boundary as an http.RoundTripper: it admits
// each request under a Gate (and budgets kept beside it, WithBudgets; a
// fleet's caps and budgets, WithFleet and WithFleetBudgets), puts the
// granted API key's credential on it, sends it, reports the upstream's
// answer to the Gate before the request's slot can be freed, and holds
// the slot until the response body is done, as a slots.Transport does. A
// request that fails, or is refused, returns its error with nothing held;
// one that base chose not to send (its error wraps slots.ErrNotSent), or
// that failed to connect (a dial error), charges the Gate's budgets
// nothing and takes no start of its spacing, unless it went ahead without
// a slot (on_wait_timeout "proceed"), whose estimate stands (see
// Gate.Settle).
// It reads answers as they pass (a refusal's first bytes, the usage), so it
// sends requests without the client's Accept-Encoding (but "identity"):
// net/http's Transport then asks for gzip itself, unless its
// DisableCompression is set, and decompresses, so the caller gets the
// answer uncompressed (and a ReverseProxy relays it so).
//
// A refusal is returned as the error of the Gate or the fleet (a
// *slots.LimitError, or the context's error), marked as a refusal:
// slots.ProxyErrorHandler answers it with 429 and Retry-After in a
// ReverseProxy. A request sent under slots.WithoutSlot takes no slot and
// is not reported.
//
// Create one with NewTransport; the zero value is not usable.
type Transport struct {
	gate             *Gate
	inner            *slots.Transport
	base             http.RoundTripper
	model            func(*http.Request) string // nil: the body's "model"
	caps             FleetCaps
	tokenCaps        FleetTokenCaps
	reserve          func(context.Context, string, Tokens) (FleetReservation, error) // WithFleetBudgets
	reserveHere      func(context.Context, string, Tokens) (*Reservation, error)     // WithBudgets
	credential       func(h http.Header, key string)
	classifier       Classifier
	streamUsage      bool // WithStreamUsage
	rateLimitHeaders bool // WithRateLimitHeaders
}

var _ http.RoundTripper = (*Transport)(nil)

// A TransportOption configures a Transport; a nil one is ignored.
type TransportOption interface{ applyTransport(*transportConfig) }

// transportOptionFunc adapts a function to TransportOption.
type transportOptionFunc func(*transportConfig)

func (f transportOptionFunc) applyTransport(c *transportConfig) { f(c) }

type transportConfig struct {
	t      Transport
	linger time.Duration
}

// DefaultCutLinger is how long a Transport keeps the slot of an exchange
// cut short (the client went away mid-stream) after letting go of it: long
// enough for an upstream on the same network to notice the cut, so that
// the next request does not reach it while it still counts the cut one
// (see slots.WithLinger).
const DefaultCutLinger = 50 * time.Millisecond

// WithCutLinger sets how long the slot of a cut exchange is kept after
// this side has let go of it (default DefaultCutLinger; 0 or less: not
// at all). See slots.WithLinger.
func WithCutLinger(d time.Duration) TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.linger = d })
}

// WithModel sets how a request's model is found without reading its body
// (from a header, or the path), for requests whose context has no
// WithModelName. By default it is the "model" of the JSON body (see
// ModelField), read into memory up to MaxModelBody.
func WithModel(f func(*http.Request) string) TransportOption {
	return transportOptionFunc(func(c *transportConfig) {
		if f != nil {
			c.t.model = f
		}
	})
}

// WithFleet makes requests take the fleet's caps too (see FleetCaps).
func WithFleet(caps FleetCaps) TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.caps = caps })
}

// WithClassifier sets how the upstream's answers are read (default
// DefaultClassifier).
func WithClassifier(cl Classifier) TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.classifier = cl })
}

// NewTransport returns a Transport that admits requests under gate and
// sends them with base (nil: http.DefaultTransport). It panics if gate is
// nil.
func NewTransport(base http.RoundTripper, gate *Gate, opts ...TransportOption) *Transport {
	if gate == nil {
		panic("pacing: NewTransport needs a Gate")
	}
	if base == nil {
		base = http.DefaultTransport
	}
	c := transportConfig{t: Transport{gate: gate, base: base}, linger: DefaultCutLinger}
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.applyTransport(&c)
	}
	t := &c.t
	t.inner = slots.NewTransport(reporter{t}, t.admit, slots.WithLinger(c.linger))
	return t
}

// exchange is one request's admission, from RoundTrip to the reporter. It
// is the request's context on its way (Value finds it by exchangeKey),
// with trace on.
type exchange struct {
	context.Context
	trace  httptrace.ClientTrace
	model  string
	grant  Grant
	caps   *slots.Slot // the fleet's; nil without a fleet
	tokens *slots.Slot // the fleet's token caps; nil without them
	// here and spend are what it reserved of the budgets kept here
	// (WithBudgets) and of the fleet's (WithFleetBudgets; nil: nothing),
	// settled or cancelled once (spendEnded); here is closed once its
	// slots are free.
	here       *Reservation
	spend      FleetReservation
	spendEnded atomic.Bool
	weighed    bool // admitted under WithTokens: its answer's usage settles it
	// admitted: admit returned a Slot (a request under slots.WithoutSlot
	// is sent without one, and its Trace hears nothing of it).
	admitted bool
	// dropUsage: the Transport asked the stream for its usage
	// (WithStreamUsage); the client gets no usage chunk.
	dropUsage bool
	// asked and got: net/http's Transport asked for a connection for the
	// request, and got one (httptrace): a failure between the two sent
	// nothing.
	asked, got atomic.Bool
	// parent is the request's own context, without the httptrace that
	// sets asked and got: the context of the calls made on its behalf
	// (the fleet's caps, its budgets' reservation), whose connections (a
	// store that speaks HTTP) are not the request's.
	parent context.Context
}

type exchangeKey struct{}

func (x *exchange) Value(key any) any {
	if key == (exchangeKey{}) {
		return x
	}
	return x.Context.Value(key)
}

// errNoAnswer is a base RoundTripper's nil response with a nil error, which
// net/http's own Client reports as an error too.
var errNoAnswer = errors.New("pacing: the RoundTripper returned a nil *Response with a nil error")

// RoundTrip admits req, sends it with its API key, and ties the slot to
// the response body (see Transport). It never modifies req. A request
// whose model cannot be found fails with a *slots.BadRequestError, with
// nothing sent and nothing held.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	model, out, err := t.modelOf(req) // an error comes after the body was read and closed
	if err != nil {
		return nil, err
	}
	x := &exchange{model: model}
	if _, weighed := tokensOf(out.Context()); t.streamUsage && weighed {
		if out, x.dropUsage, err = askUsageOf(out); err != nil {
			return nil, err
		}
	}
	x.trace.GetConn = func(string) { x.asked.Store(true) }
	x.trace.GotConn = func(httptrace.GotConnInfo) { x.got.Store(true) }
	x.parent = out.Context()
	x.Context = httptrace.WithClientTrace(x.parent, &x.trace)
	return t.inner.RoundTrip(out.WithContext(x))
}

// admit takes the fleet's caps, then waits for the Gate. Whatever it
// took is given back if it does not return it: on a refusal, and on a
// panic (in a Trace hook, say).
func (t *Transport) admit(req *http.Request) (_ *slots.Slot, err error) {
	x, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return nil, errors.New("pacing: a request not sent through the Transport's RoundTrip")
	}
	ctx := x.parent // req's, but for the exchange's httptrace (see exchange.parent)
	trs := tracesOf(ctx)
	if wait, ok := ctx.Value(waitKey{}).(context.Context); ok {
		if err := wait.Err(); err != nil { // ended already: no admission races it
			err = fmt.Errorf("pacing: acquire: %w", err)
			trs.refused(err)
			return nil, err
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(wait, cancel)()
	}
	var held *slots.Slot
	returned, granted := false, false
	told := 0 // the Traces told Admitted
	defer func() {
		if returned {
			return
		}
		defer trs[:told].unsentAfterPanic(t.gate.eng.Log()) // last: the Traces told Admitted hear it was not sent
		defer endBudgets(x, Settlement{})                   // after the slots: it charges nothing
		if granted {                                        // not sent: the Gate's grant is given back, as startBudgets gives it
			t.gate.unsent(x.grant)
		}
		if held != nil { // the Traces that heard Admitted hear Released
			// Cancelled before the release, which closes it (its estimate
			// would stand): not sent, it charges nothing.
			x.here.Cancel()
			held.Release()
		} else {
			x.grant.Slot.Release()
			x.caps.Release()
			x.tokens.Release()
		}
		x.grant, x.caps, x.tokens = Grant{}, nil, nil
	}()
	start := time.Now()
	trs.waiting()
	cost, weighed := tokensOf(ctx)
	if !weighed {
		cost = Tokens{Input: 1}
	}
	if err := cost.Check(); err != nil { // before any wait: no cap could take it
		trs.refused(err)
		return nil, err
	}
	x.weighed = weighed
	if t.reserve != nil || t.reserveHere != nil {
		if err := t.reserveBudgets(ctx, x); err != nil {
			trs.refused(err)
			return nil, err
		}
	}
	if t.caps != nil || t.tokenCaps != nil {
		var err error
		func() {
			if done := trs.fleetWait(); done != nil {
				defer done() // x.caps is set by then: a panic in it frees them
			}
			if t.caps != nil {
				x.caps, err = t.fleetCaps(ctx, x.model)
			}
			if err == nil && t.tokenCaps != nil {
				x.tokens, err = t.fleetTokens(ctx, x.model, cost.Total())
			}
		}()
		if err != nil {
			x.caps.Release() // before the Trace hears of it
			x.caps = nil
			trs.refused(err)
			return nil, err
		}
	}
	x.grant, err = t.gate.AcquireTokens(ctx, x.model, cost)
	if err == nil {
		if err = t.startBudgets(ctx, x); err != nil { // given back to the Gate: it charges nothing, unless a bypass
			x.grant.Slot.Release()
			x.grant = Grant{}
		}
	}
	if err != nil {
		x.caps.Release() // before the Trace hears of it
		x.tokens.Release()
		x.caps, x.tokens = nil, nil
		endBudgets(x, Settlement{})
		trs.refused(err)
		return nil, err
	}
	granted = true // from here a panic (in a Trace's Admitted) sends nothing
	at := time.Now()
	a := Admission{Grant: x.grant, Wait: at.Sub(start)}
	var released func() // the Traces hear when the slots go, unless one part held nothing
	var h *heard        // what they heard; made only then (a would escape on every request)
	if !x.grant.Slot.Bypassed() && !x.caps.Bypassed() && !x.tokens.Bypassed() && trs.hears(func(tr *Trace) bool { return tr.Released != nil }) {
		h = new(heard)
		released = func() {
			defer func() {
				if p := recover(); p != nil {
					t.gate.eng.Log().Error("pacing: a Trace's Released panicked; the slots are free", slog.Any("panic", p))
				}
			}()
			trs[:h.n].released(h.a, time.Since(at))
		}
	}
	if here, traced := x.here, released; here != nil { // closed once the slots are free: what was not settled stands
		released = func() {
			defer here.Close()
			if traced != nil {
				traced()
			}
		}
	}
	held = (*slots.Slot)(core.Combine(released, (*core.Handle)(x.grant.Slot), (*core.Handle)(x.caps), (*core.Handle)(x.tokens)))
	if held == nil {
		x.here.Close() // nothing held: nothing to wait for
	}
	a.Held = held
	trs.admitted(a, h, &told)
	x.admitted = true
	returned = true
	return held, nil
}

// reporter sends a request under the slots Transport and reports the
// answer to the Gate and the fleet before that Transport can free the
// slot: a refusal lowers a learned cap before the next request starts.
type reporter struct{ t *Transport }

// TellsUnsent: reporter reports a request never sent as httpx.Unsent (and
// one that may have been sent though it failed to dial as httpx.Sent).
func (reporter) TellsUnsent() {}

func (r reporter) RoundTrip(req *http.Request) (*http.Response, error) {
	t := r.t
	x, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if ae := req.Header.Get("Accept-Encoding"); x != nil && (t.credential != nil || ae != "" && ae != "identity") {
		req = req.Clone(req.Context()) // its own headers; the body is shared
		// The answer is read as it passes (a refusal's first bytes, the
		// usage): it must come as the upstream's words, not compressed
		// for the client. Without the client's Accept-Encoding, net/http's
		// Transport asks for gzip itself and decompresses.
		if ae != "identity" {
			req.Header.Del("Accept-Encoding")
		}
		if t.credential != nil && offHost(req) {
			// No key's secret, nor the caller's own Authorization (net/http's
			// Client sends it on to a subdomain of the first host).
			req.Header.Del("Authorization")
		} else if t.credential != nil {
			ok := false
			defer func() {
				if !ok { // it panicked: the request is not sent
					t.gate.unsent(x.grant) // its grant given back, as admit gives it on a panic
					endBudgets(x, Settlement{})
					if x.admitted { // the Traces told Admitted hear it was not sent, as admit tells them
						tracesOf(req.Context()).unsentAfterPanic(t.gate.eng.Log())
					}
				}
			}()
			if err := credential(t.credential, req, x.grant.Key); err != nil {
				return nil, err
			}
			ok = true
		}
	}
	var resp *http.Response
	var err error
	if cause := context.Cause(req.Context()); cause != nil && x != nil {
		// Ended after the admission: net/http would give it up unsent,
		// with this error.
		if req.Body != nil {
			req.Body.Close()
		}
		err = &httpx.Unsent{Err: cause}
	} else {
		resp, err = t.base.RoundTrip(req)
	}
	if x == nil {
		return resp, err
	}
	if err == nil && resp == nil {
		err = errNoAnswer // reported as any failure to send
	}
	if err != nil && x.asked.Load() && !x.got.Load() && !httpx.NotSent(err, slots.ErrNotSent) {
		// net/http's Transport gave up waiting for a connection (its context
		// ended meanwhile, during a dial say): sent nothing, which it tells
		// with the bare context error. So that the slots Transport frees
		// the slot at once, not after a linger:
		err = &httpx.Unsent{Err: err}
	} else if x.got.Load() && httpx.NotSent(err, slots.ErrNotSent) && !errors.Is(err, slots.ErrNotSent) {
		// A failed dial after a connection was had is net/http's retry of
		// a request that may have been sent on it: so that the slots
		// Transport keeps the slot for the linger, as a cut's:
		err = &httpx.Sent{Err: err}
	}
	if resp != nil && resp.Request == nil {
		resp.Request = req // as net/http's own do: ClassifyAsRead reads the method there
	}
	// A panic from here on (a Classifier's, a Trace hook's) leaves with the
	// answer's body closed, so that its connection does not stay open once
	// the slot is freed.
	var onPanic io.Closer // nil once returned
	if resp != nil && resp.Body != nil {
		onPanic = resp.Body
	}
	defer func() {
		if onPanic != nil {
			onPanic.Close()
		}
	}()
	// A slot that holds nothing (a bypass) is no evidence for its cap.
	toGate := x.grant.Slot != nil && !x.grant.Slot.Bypassed()
	toFleet := t.caps != nil && x.caps != nil && !x.caps.Bypassed()
	trs := tracesOf(req.Context())
	weighed := x.weighed && err == nil
	// A request that was not sent used nothing: as one the upstream
	// refused, it charges nothing.
	// A failed dial after a connection was had is net/http's retry of a
	// request that may have been sent on it.
	notSent := httpx.NotSent(err, slots.ErrNotSent) && (!x.got.Load() || errors.Is(err, slots.ErrNotSent))
	hears := (err == nil || notSent) && x.admitted && trs.hears(func(tr *Trace) bool { return tr.Settled != nil })
	var told atomic.Bool
	settled := func(st Settlement) { // the budgets and the Trace hear it once
		if told.CompareAndSwap(false, true) {
			endBudgets(x, st)
			trs.settled(st)
		}
	}
	if toGate || toFleet || hears || x.spend != nil || x.here != nil {
		answer := resp
		if err != nil || resp != nil && resp.StatusCode == http.StatusSwitchingProtocols {
			answer = nil // no answer, or no admission of a model request
		}
		// An error answer is classified from its first bytes as they pass, by
		// the body's end or Close at the latest: before the slot goes.
		ClassifyAsRead(answer, t.classifier, func(v Verdict) {
			if toGate && !notSent { // no answer: nothing to learn
				t.gate.Report(x.grant, v)
			}
			if toFleet {
				t.caps.Report(x.caps, v)
			}
			switch {
			case notSent:
				t.gate.unsent(x.grant)
				settled(Settlement{})
			case err != nil:
			case v.Kind != Admitted && v.Kind != Other:
				settled(Settlement{}) // refused by the upstream: as the Gate's budgets (Report)
			case resp.StatusCode == http.StatusTooManyRequests:
				// A refusal whose kind its body, cut, no longer tells
				// (ClassifyAsRead): nothing learned, nothing served.
				t.gate.settle(x.grant, Tokens{}, endedUnserved)
				settled(Settlement{})
			case resp.StatusCode/100 == 4 || resp.StatusCode/100 == 3 && resp.Header.Get("Location") != "":
				// A client error, a redirect: it used nothing, but it was sent.
				t.gate.settle(x.grant, Tokens{}, endedSent)
				settled(Settlement{Served: true})
			}
		})
	}
	if t.rateLimitHeaders && err == nil {
		SetAnswerRateLimitHeaders(resp, append(budgetsLeft(x), t.gate.Budgets()...), x.model, x.grant.Key)
	}
	// An answer without a body reports no usage: its estimate stands, and
	// the slots Transport frees its slot at once.
	hasBody := err == nil && !httpx.Bodiless(req.Method, resp)
	if weighed && hasBody && resp.StatusCode/100 == 2 { // its budgets are settled with the usage the answer reports
		resp.Body = WatchUsage(resp.Body, resp.Header.Get("Content-Type"), func(used Tokens) {
			t.gate.Settle(x.grant, used) // nothing for a bypass
			settled(Settlement{Served: true, Used: used})
		})
	}
	if x.dropUsage && hasBody && resp.StatusCode/100 == 2 {
		dropUsage(resp) // read by WatchUsage if weighed, kept from the client who did not ask
	}
	onPanic = nil
	return resp, err
}

type waitKey struct{}

// WithWaitContext returns a context under which a Transport gives up
// waiting for admission when wait ends as well as when ctx does, while
// the exchange itself runs under ctx alone: a server that drains ends the
// waits of its requests, not the answers it is relaying.
func WithWaitContext(ctx, wait context.Context) context.Context {
	return context.WithValue(ctx, waitKey{}, wait)
}
