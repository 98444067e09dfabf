// Package httpx holds the HTTP rules that more than one of the module's
// packages apply.
package httpx

import (
	"errors"
	"net"
	"net/http"
)

// NotSent reports whether a round trip that failed with err never reached
// the upstream: a base chose not to send it (err wraps notSent, which is
// slots.ErrNotSent: this package cannot import slots, which imports it),
// it never had a connection (Unsent), or it could not connect (a dial
// error) unless a RoundTripper that watched it tells it Sent. Any other
// failure may have been sent. A nil err is no failure: false, without the
// allocation of the search.
func NotSent(err, notSent error) bool {
	if err == nil {
		return false
	}
	var sent *Sent
	if errors.As(err, &sent) {
		return false
	}
	var u *Unsent
	if errors.Is(err, notSent) || errors.As(err, &u) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// UnsentTeller is a RoundTripper that reports a round trip given up before
// it had a connection as Unsent itself (pacing's, under its slots
// Transport): a slots Transport over it adds no watch of its own.
type UnsentTeller interface{ TellsUnsent() }

// Unsent is the error of a round trip that never had a connection, as a
// RoundTripper that watched it tells (its context ended while it waited
// for one, which net/http reports with the bare context error): its text
// and what it wraps are Err's, so that callers see what they would have.
type Unsent struct{ Err error }

func (e *Unsent) Error() string { return e.Err.Error() }
func (e *Unsent) Unwrap() error { return e.Err }

// Sent is the error of a round trip that may have reached the upstream
// though its error says it could not connect, as a RoundTripper that
// watched it tells: a dial error after a connection was had is net/http's
// retry, on a new connection, of a request written on a reused one that
// broke. Its text and what it wraps are Err's.
type Sent struct{ Err error }

func (e *Sent) Error() string { return e.Err.Error() }
func (e *Sent) Unwrap() error { return e.Err }

// Bodiless reports whether resp, the answer to a request of method, has no
// body to read: none, http.NoBody, or one that HTTP rules out (an answer to
// HEAD; 1xx but 101; 204; 304), which HTTP/2 answers with a Body that is not
// http.NoBody.
func Bodiless(method string, resp *http.Response) bool {
	s := resp.StatusCode
	return resp.Body == nil || resp.Body == http.NoBody || method == http.MethodHead ||
		s == http.StatusNoContent || s == http.StatusNotModified || s/100 == 1 && s != http.StatusSwitchingProtocols
}

// Method returns the method of the request resp answers, if it says.
func Method(resp *http.Response) string {
	if resp.Request == nil {
		return ""
	}
	return resp.Request.Method
}
