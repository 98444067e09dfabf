package slots

import (
	"context"
	"errors"
	"net/http"
	"weak"
)

// AdmitFunc admits one request: it picks the cap (a Limiter, a registry key
// from a header, the path or the body's "model") and returns the Slot, or a
// rejection. A nil Slot with a nil error admits the request without a slot.
// A Slot returned along with an error is released. An admit function used
// by a Transport must not replace the request's body (see RequestModel).
type AdmitFunc func(r *http.Request) (*Slot, error)

// Transport is an http.RoundTripper that holds a Slot for each request from
// before it is sent until its response body is done: read to the end, closed,
// or cut off by the end of the request's context. A streamed response keeps
// its slot for the whole stream, not just until RoundTrip returns.
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
// func it runs.
type Transport struct {
	base  http.RoundTripper
	admit AdmitFunc
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport that admits each request with admit and
// sends it with base (nil: http.DefaultTransport). It panics if admit is nil.
func NewTransport(base http.RoundTripper, admit AdmitFunc) *Transport {
	if admit == nil {
		panic("slots: NewTransport needs an admit function")
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{base: base, admit: admit}
}

// RoundTrip admits req, sends it, and ties the slot to the response body.
// When admission fails it returns the error (a *LimitError, or the context's
// error while waiting) and closes req.Body, as a RoundTripper must when it
// does not send. A failed round trip releases the slot at once. It never
// modifies req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if withoutSlot(ctx) {
		return t.base.RoundTrip(req)
	}
	s, err := t.admit(req)
	if err != nil {
		s.releaseQuietly() // an admit that returned a slot along with its error
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := t.sendHolding(req, s)
	if err != nil || resp == nil {
		s.releaseQuietly()
		if resp != nil && resp.Body != nil {
			resp.Body.Close() // a response that came with an error is dropped
		}
		if err == nil {
			err = errNilResponse
		}
		return nil, err
	}
	if !s.holds() {
		return resp, nil // admit chose to take no slot
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The caller owns the upgraded connection: net/http does not close
		// it when the request's context ends, so the slot stays with it
		// until it is closed or fails.
		resp.Body = wrapBody(resp.Body, s, nil)
		return resp, nil
	}
	// The connection is torn down when the request's context ends, whether
	// or not anyone reads or closes the body; the slot goes with it. (A
	// context that can never end needs no watch, which costs three
	// allocations.)
	var stop func() bool
	if ctx.Done() != nil {
		release := s.releaseQuietly
		if s.tracked() {
			// With leak detection the watch must not keep s reachable:
			// a dropped body would then never be found.
			wp := weak.Make(s)
			release = func() {
				if s := wp.Value(); s != nil {
					s.releaseQuietly()
				}
			}
		}
		stop = context.AfterFunc(ctx, release)
	}
	resp.Body = wrapBody(resp.Body, s, stop)
	return resp, nil
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
