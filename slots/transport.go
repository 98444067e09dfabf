package slots

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sync/atomic"
	"time"
	"weak"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/httpx"
)

// AdmitFunc admits one request and returns its Slot or a refusal (a nil
// Slot and error: no slot). A Transport's must not replace the body.
type AdmitFunc func(r *http.Request) (*Slot, error)

// Transport is an http.RoundTripper that holds a Slot for each request from
// before it is sent until its response body is read to the end, closed, or
// cut off by its context's end (a stream keeps it throughout). A cut
// exchange's slot goes back once its body is closed (WithLinger: later), at
// most 5 s after; a 101's, once closed (or, of a server's request passed
// on as by a ReverseProxy, unused 1 s after it: dropped). Not usable as zero.
type Transport struct {
	base   http.RoundTripper
	admit  AdmitFunc
	linger time.Duration
	clock  clock.Clock
}

var _ http.RoundTripper = (*Transport)(nil)

// A TransportOption configures a Transport; a nil one is ignored.
type TransportOption interface{ applyTransport(*Transport) }

// transportOptionFunc adapts a function to TransportOption.
type transportOptionFunc func(*Transport)

func (f transportOptionFunc) applyTransport(c *Transport) { f(c) }

// WithLinger keeps a cut exchange's slot (body closed early or failed,
// round trip failed once sent, dropped under leak detection) d more (d <= 0:
// none, the default), for an upstream that counts it until it sees the cut.
func WithLinger(d time.Duration) TransportOption {
	return transportOptionFunc(func(t *Transport) { t.linger = d })
}

// applyTransport makes WithClock's clock time the Transport's waits
// (WithLinger, a cut body's close, a dropped 101's); nil is ignored.
func (o clockOption) applyTransport(t *Transport) { t.clock = cmp.Or(o.c, t.clock) }

// NewTransport returns a Transport that admits each request with admit and
// sends it with base (nil: http.DefaultTransport). It panics if admit is nil.
func NewTransport(base http.RoundTripper, admit AdmitFunc, opts ...TransportOption) *Transport {
	if admit == nil {
		panic("slots: NewTransport needs an admit function")
	}
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, admit: admit}
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.applyTransport(t)
	}
	if t.clock == nil {
		t.clock = clock.New()
	}
	return t
}

// admitClosing is admit that closes req's body if admit panics (a hook's
// panic, say), as a RoundTripper that does not send must.
func (t *Transport) admitClosing(req *http.Request) (*Slot, error) {
	returned := false
	defer func() {
		if !returned && req.Body != nil {
			req.Body.Close()
		}
	}()
	s, err := t.admit(req)
	returned = true
	return s, err
}

// RoundTrip admits req, sends it, and ties the slot to the response body.
// A refusal (admit's, or a base's error wrapping ErrNotSent) holds nothing.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	req = withSentBody(req)
	if withoutSlot(ctx) {
		resp, err := t.base.RoundTrip(req)
		if err != nil && errors.Is(err, ErrNotSent) {
			if resp != nil && resp.Body != nil {
				resp.Body.Close()
			}
			return nil, &admitError{err} // the base's refusal, as with a slot
		}
		return resp, err
	}
	s, err := t.admitClosing(req)
	if err != nil {
		s.releaseQuietly() // an admit that returned a slot along with its error
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &admitError{err}
	}
	// With leak detection, the reclaim of a Slot dropped with its
	// response ends the exchange, through a context of its own (a
	// response body may reach the response, and so the Slot: it cannot be
	// kept for a Close), before its capacity is handed out again.
	var abort context.CancelFunc
	var sent context.Context // the exchange's own context, with abort
	asked := req
	if s.holds() && tracked((*core.Handle)(s)) {
		sent, abort = context.WithCancel(ctx)
		req = req.WithContext(sent)
		body := req.Body
		onReclaim((*core.Handle)(s), func(rest func()) {
			// Freed after the linger, as a cut's: the upstream may count
			// the exchange until it notices its end.
			defer t.later(rest)
			abort()
			if body != nil && body != http.NoBody {
				// net/http's HTTP/2 client does not end a stream whose
				// request body's Read is blocked when its context ends:
				// the body's Close ends that Read.
				body.Close()
			}
		})
	}
	req, conn := t.watchConn(req)
	var resp *http.Response
	if conn != nil && ctx.Err() != nil {
		// Ended since: net/http gives it up unsent, before it asks for
		// a connection, with its cause; not a cut.
		if req.Body != nil {
			req.Body.Close()
		}
		err = &httpx.Unsent{Err: context.Cause(ctx)}
	} else {
		resp, err = t.sendHolding(req, s, abort)
	}
	if abort != nil {
		if resp != nil && resp.Request == req {
			resp.Request = asked // not the copy whose context is cancelled
		}
		if err != nil || resp == nil || httpx.Bodiless(req.Method, resp) || resp.StatusCode == http.StatusSwitchingProtocols {
			defer abort() // the exchange is over, or (a 101) net/http watches the context no more
		}
	}
	if err != nil || resp == nil {
		if err == nil {
			err = errNilResponse
		}
		defer t.free(s, conn.cut(err)) // also if Close panics
		if resp != nil && resp.Body != nil {
			resp.Body.Close() // a response that came with an error is dropped
		}
		if errors.Is(err, ErrNotSent) {
			return nil, &admitError{err} // the base's refusal
		}
		return nil, err
	}
	if !s.holds() {
		return resp, nil // admit chose to take no slot
	}
	if httpx.Bodiless(req.Method, resp) {
		s.releaseQuietly() // the answer is complete
		return resp, nil
	}
	body, b := newSlotBody(resp.Body, s, t)
	if abort != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		// With leak detection the caller gets a copy of the response: a
		// base may keep the one it returned while the exchange is open
		// (net/http's HTTP/2 client does, to set its Trailer), and would
		// keep the body, and so s, reachable: a dropped one would never be
		// found. The copy takes the base's Trailer at the body's end.
		c := &copied{out: *resp, base: resp}
		b.copied, resp = c, &c.out
	}
	resp.Body = body
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The caller owns the upgraded connection: net/http does not close
		// it when the request's context ends, so the slot stays with it
		// until it is closed or fails (or a ReverseProxy drops it unused:
		// upgrade.go).
		b.conn = true // whatever its methods: its reading side's end is not its end
		b.listUpgrade(ctx, req.RequestURI != "")
		return resp, nil
	}
	// net/http tears the connection down when the request's context ends,
	// whether or not anyone reads or closes the body. The watch closes the
	// body itself, so that the slot goes only once net/http has given the
	// connection up. A context that can never end needs no watch, which
	// costs three allocations.
	if ctx.Done() != nil {
		b.ctx = ctx
		if abort != nil {
			// With leak detection the watch must not keep the body (and so
			// s) reachable: a dropped body would then never be found. It
			// watches the exchange's own context, which ends with ctx and
			// which the reclaim of a dropped body ends (abort), so that it
			// is not left on ctx, a long-lived one, once the body is gone.
			// Its end ends the exchange's context too, once it is stopped.
			wp := weak.Make(b)
			stop := context.AfterFunc(sent, func() {
				if b := wp.Value(); b != nil {
					b.watch()
				}
			})
			b.stop = func() bool { ok := stop(); abort(); return ok }
		} else {
			b.stop = context.AfterFunc(ctx, b.watch)
		}
	}
	return resp, nil
}

// free releases s: at once, or after the linger when cut says the upstream
// may still be counting the exchange.
func (t *Transport) free(s *Slot, cut bool) {
	if cut && t.linger > 0 && s.holds() {
		t.later(func() {
			defer core.Recovered("a linger's timer", s.hold()) // an Observer told of the release
			s.releaseQuietly()
		})
		return
	}
	s.releaseQuietly()
}

// later calls f after the linger, or at once without one.
func (t *Transport) later(f func()) {
	if t.linger > 0 {
		t.clock.AfterFunc(t.linger, f)
		return
	}
	f()
}

// connWatch tells whether net/http's Transport was asked for a connection
// for a request and gave it one. One whose context ended while it waited
// for a connection (during a dial, say) was given up unsent, which it
// tells only with the bare context error.
type connWatch struct {
	trace      httptrace.ClientTrace
	asked, got atomic.Bool
}

// watchConn returns req with a connWatch on its context, with WithLinger
// alone (only a linger tells a cut from a request never sent), unless its
// base tells that itself.
func (t *Transport) watchConn(req *http.Request) (*http.Request, *connWatch) {
	if t.linger <= 0 {
		return req, nil
	}
	if _, tells := t.base.(httpx.UnsentTeller); tells {
		return req, nil
	}
	w := &connWatch{}
	w.trace.GetConn = func(string) { w.asked.Store(true) }
	w.trace.GotConn = func(httptrace.GotConnInfo) { w.got.Store(true) }
	return req.WithContext(httptrace.WithClientTrace(req.Context(), &w.trace)), w
}

// cut reports whether a round trip that failed with err may have been
// sent. One that had a connection may have, whatever the error, unless its
// base chose not to send it: a dial error after a connection was had is
// net/http's retry, on a new connection, of a request written on a reused
// one that broke. One asked a connection for and never given one was not.
// w may be nil (no watch): then err alone tells.
func (w *connWatch) cut(err error) bool {
	if w != nil && w.got.Load() && !errors.Is(err, ErrNotSent) {
		return true
	}
	return !httpx.NotSent(err, ErrNotSent) && !(w != nil && w.asked.Load() && !w.got.Load())
}

// sendHolding sends req with the base transport; if the base panics, s is
// released, and the exchange's context ended (abort, if not nil), before
// the panic goes on (no recover: the panic keeps its stack).
func (t *Transport) sendHolding(req *http.Request, s *Slot, abort context.CancelFunc) (*http.Response, error) {
	sent := false
	defer func() {
		if !sent {
			if abort != nil {
				defer abort() // also if the release's Observer panics
			}
			s.releaseQuietly()
		}
	}()
	resp, err := t.base.RoundTrip(req)
	sent = true
	return resp, err
}

// admitError marks an error of a Transport's admit function. ReverseProxy
// hands its ErrorHandler the Transport's refusals and the upstream's
// failures alike, and both may wrap context.DeadlineExceeded.
type admitError struct{ err error }

func (e *admitError) Error() string { return e.err.Error() }
func (e *admitError) Unwrap() error { return e.err }

// Is makes a refusal a request not sent, for a Transport above this one.
func (e *admitError) Is(target error) bool { return target == ErrNotSent }

var errNilResponse = errors.New("slots: RoundTripper returned a nil *Response with a nil error")

type noSlotKey struct{}

// WithoutSlot returns ctx under which a Transport takes no slot.
func WithoutSlot(parent context.Context) context.Context {
	return context.WithValue(parent, noSlotKey{}, true)
}

func withoutSlot(ctx context.Context) bool {
	v, _ := ctx.Value(noSlotKey{}).(bool)
	return v
}

// sentBody is the body of a request of known length, as the base
// RoundTripper reads it. net/http's HTTP/1 transport reads such a body once
// more after its last byte, to check that it is not longer than declared.
// In a proxy the body is the server's inbound one, and net/http's server
// reads the rest of it away and closes it as soon as the answer's header
// goes to the client: a streaming answer can go before that extra read,
// which then fails with http.ErrBodyReadAfterClose, and the transport drops
// the upstream connection, cutting the stream it is answering
// (golang/go#40747). A close found once the declared length has been read
// is the body's end; one found before it is still an error.
type sentBody struct {
	io.ReadCloser
	left int64 // bytes of the declared length not read yet
}

func (b *sentBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left <= 0 && errors.Is(err, http.ErrBodyReadAfterClose) {
		err = io.EOF
	}
	return n, err
}

// withSentBody returns req with its body read as a sentBody, if it has a
// body of known length that may be a server's (a shallow copy: a
// RoundTripper must not modify the request), else req. A body with GetBody
// is the client's own, in memory: net/http sends it with the header in one
// write, which it could not tell for a wrapped one.
func withSentBody(req *http.Request) *http.Request {
	if req.ContentLength <= 0 || req.Body == nil || req.Body == http.NoBody || req.GetBody != nil {
		return req
	}
	r := *req
	r.Body = &sentBody{ReadCloser: req.Body, left: req.ContentLength}
	return &r
}

// onReclaim makes the reclaim of x's holds (leak detection's, of a Slot
// dropped while held) call f first (core.Tracked.First), which must call
// the rest of the reclaim: once for each part of a Combine.
func onReclaim(x *core.Handle, f func(rest func())) {
	switch o := x.Hold().Owner.(type) {
	case *core.Tracked:
		o.First.Store(&f)
	case interface{ Parts() []*core.Handle }:
		for _, p := range o.Parts() {
			onReclaim(p, f)
		}
	}
}

// tracked reports whether x stands in for a hold kept apart from it, or
// combines only ones that do (Combine, pacing's Transport): with leak
// detection, such a Slot must not be kept reachable by the library. One
// that combines an untracked hold too is watched as any other, so that
// the context's end frees it (dropped, the untracked part would have
// nothing to free it); a dropped body is then not reported as a leak.
func tracked(x *core.Handle) bool {
	switch o := x.Hold().Owner.(type) {
	case *core.Tracked:
		return true
	case interface{ Parts() []*core.Handle }:
		return !slices.ContainsFunc(o.Parts(), func(p *core.Handle) bool { return !tracked(p) })
	}
	return false
}
