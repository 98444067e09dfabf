package slots

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
	"weak"

	"github.com/benbjohnson/clock"
)

// AdmitFunc admits one request: it picks the cap (a Limiter, a registry key
// from a header, the path or the body's "model") and returns the Slot, or a
// rejection. A nil Slot with a nil error admits the request without a slot.
// A Slot returned along with an error is released. An admit function used
// by a Transport must not replace the request's body: a RoundTripper does
// not modify its request, so a handler that reads the body (for a "model",
// say) passes what it found on in the request's context.
type AdmitFunc func(r *http.Request) (*Slot, error)

// Transport is an http.RoundTripper that holds a Slot for each request from
// before it is sent until its response body is done: read to the end, closed,
// or cut off by the end of the request's context. A streamed response keeps
// its slot for the whole stream, not just until RoundTrip returns.
//
// A slot goes back only once this side has let go of the upstream
// exchange: when the request's context ends, the Transport closes the
// response body itself before it releases the slot, and a failed Read
// closes the body before its slot goes as well. What "let go" can mean is
// what the base transport's Body.Close gives. net/http's HTTP/1 transport
// returns from an early Close once its read loop has given the connection
// up, and the loop closes the socket on its own goroutine an instant later,
// so the socket may still be closing when the slot goes. Its HTTP/2
// transport returns once the stream's reset has been sent, except after
// the request's context has ended, when the reset is sent concurrently.
// The upstream learns of the cut later still, when the close reaches it and
// its server notices, and until then it counts the request: WithLinger
// keeps the slot of a cut exchange for that time. The end of the context
// frees the slot even if the body's Close does not return: 5 s after it
// ended at the latest.
//
// An upgraded connection (101 Switching Protocols) keeps its slot until it is
// closed or fails, even after the request's context ends: net/http leaves
// that connection open for the caller. A request whose context was marked by
// WithoutSlot takes no slot. The zero value is not usable; use NewTransport.
//
// Cost: over its base, a request allocates the Slot (in admit) and the body
// wrapper. A request whose context can end (a proxied request's always can)
// also pays the three allocations of the context.AfterFunc that frees the
// slot when the context ends: AfterFunc's context, its stop func, and the
// func it runs. A request with a body of known length that is not in
// memory (a proxy's, whose body is its server's) pays two more: a copy of
// the request and a wrapper of its body (see RoundTrip). A cut
// exchange with a linger pays for its timer.
type Transport struct {
	base   http.RoundTripper
	admit  AdmitFunc
	linger time.Duration
	clock  clock.Clock
}

var _ http.RoundTripper = (*Transport)(nil)

// A TransportOption configures a Transport.
type TransportOption func(*Transport)

// WithLinger keeps the slot of a cut exchange for d more after this side
// has let go of it, for an upstream that notices a cut late: one behind a
// load balancer that holds its side of the connection open, or one that
// counts a request until its next write fails. Without it the next request
// can reach the upstream while the upstream still counts the cut one, and
// an upstream whose own limit equals the cap answers it 429.
//
// A cut is an exchange that ends before its response does: the request's
// context ends, the body is closed before its end or a Read of it fails,
// or the round trip fails after the request may have been sent (any error
// but a failed dial). A response read to its end, and a response without a
// body, free their slot at once. A body whose Read, WriteTo or Close panics
// frees it at once too. d <= 0 (the default) lingers not at all.
func WithLinger(d time.Duration) TransportOption {
	return func(t *Transport) { t.linger = d }
}

// WithLingerClock sets the clock that times WithLinger; for tests. The
// default is the real clock.
func WithLingerClock(c clock.Clock) TransportOption {
	return func(t *Transport) {
		if c != nil {
			t.clock = c
		}
	}
}

// NewTransport returns a Transport that admits each request with admit and
// sends it with base (nil: http.DefaultTransport), configured by opts (see
// WithLinger). It panics if admit is nil.
func NewTransport(base http.RoundTripper, admit AdmitFunc, opts ...TransportOption) *Transport {
	if admit == nil {
		panic("slots: NewTransport needs an admit function")
	}
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, admit: admit}
	for _, o := range opts {
		o(t)
	}
	if t.clock == nil {
		t.clock = clock.New()
	}
	return t
}

// RoundTrip admits req, sends it, and ties the slot to the response body.
// A request body of known length ends at that length (see sentBody), so
// that a proxy's streamed answer is not cut when its server closes the
// inbound body.
// When admission fails it closes req.Body, as a RoundTripper must when it
// does not send, and returns the admit function's error (a *LimitError, or
// the context's error while waiting) marked as a refusal: its text is the
// same and errors.Is, errors.As and HTTPStatus see through the mark, which
// lets ProxyErrorHandler tell it from an upstream's failure. A failed round trip releases the slot at once (after the
// linger, if it may have reached the upstream). It never modifies req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	req = withSentBody(req)
	if withoutSlot(ctx) {
		return t.base.RoundTrip(req)
	}
	s, err := t.admit(req)
	if err != nil {
		s.releaseQuietly() // an admit that returned a slot along with its error
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &admitError{err}
	}
	resp, err := t.sendHolding(req, s)
	if err != nil || resp == nil {
		if err == nil {
			err = errNilResponse
		}
		defer t.free(s, mayHaveBeenSent(err)) // also if Close panics
		if resp != nil && resp.Body != nil {
			resp.Body.Close() // a response that came with an error is dropped
		}
		return nil, err
	}
	if !s.holds() {
		return resp, nil // admit chose to take no slot
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		s.releaseQuietly() // the answer is complete
		return resp, nil
	}
	body, b := newSlotBody(resp.Body, s, t)
	resp.Body = body
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The caller owns the upgraded connection: net/http does not close
		// it when the request's context ends, so the slot stays with it
		// until it is closed or fails.
		return resp, nil
	}
	// net/http tears the connection down when the request's context ends,
	// whether or not anyone reads or closes the body. The watch closes the
	// body itself, so that the slot goes only once net/http has given the
	// connection up. A context that can never end needs no watch, which
	// costs three allocations.
	if ctx.Done() != nil {
		b.ctx = ctx
		if s.tracked() {
			// With leak detection the watch must not keep the body (and so
			// s) reachable: a dropped body would then never be found.
			wp := weak.Make(b)
			b.stop = context.AfterFunc(ctx, func() {
				if b := wp.Value(); b != nil {
					b.watch()
				}
			})
		} else {
			b.stop = context.AfterFunc(ctx, b.watch)
		}
	}
	return resp, nil
}

// free releases s: at once, or after the linger when cut says the upstream
// may still be counting the exchange.
func (t *Transport) free(s *Slot, cut bool) {
	if cut && t.linger > 0 {
		t.clock.AfterFunc(t.linger, s.releaseQuietly)
		return
	}
	s.releaseQuietly()
}

// mayHaveBeenSent reports whether a round trip that failed with err may
// have reached the upstream: every failure but a dial error may have.
func mayHaveBeenSent(err error) bool {
	var op *net.OpError
	return !errors.As(err, &op) || op.Op != "dial"
}

// sendHolding sends req with the base transport; if the base panics, s is
// released before the panic goes on (no recover: the panic keeps its stack).
func (t *Transport) sendHolding(req *http.Request, s *Slot) (*http.Response, error) {
	sent := false
	defer func() {
		if !sent {
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

var errNilResponse = errors.New("slots: RoundTripper returned a nil *Response with a nil error")

type noSlotKey struct{}

// WithoutSlot returns a context under which Transport sends requests without
// taking a slot: for requests that put no load on the capped upstream, such
// as replay-cache hits, tool calls and model listings.
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
