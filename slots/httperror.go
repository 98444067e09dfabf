package slots

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// StatusClientClosedRequest is the status HTTPStatus gives a wait cut short
// because the client went away (the nginx convention; nobody reads it).
const StatusClientClosedRequest = 499

// HTTPStatus maps an admission error to the answer an HTTP layer gives:
//
//	nil                                   200, 0
//	wraps ErrExceedsLimit                 413, 0 (heavier than the cap: waiting cannot help)
//	*LimitError (any other reason)        429, its RetryAfter in whole seconds (at least 1 s)
//	wraps context.DeadlineExceeded        503, 1 s (the server's own deadline passed while waiting)
//	wraps context.Canceled                499, 0 (the client went away)
//	wraps ErrBadPriority                  400, 0 (PlaceFromHeaders met a bad X-Priority)
//	*BadRequestError                      its Status (400 by default), 0
//	anything else                         500, 0
//
// Retry-After is rounded up, so a client that honours it does not come back
// early. (The answers of Middleware, WriteError and ProxyErrorHandler also
// carry the estimate to the millisecond, in retry-after-ms.)
func HTTPStatus(err error) (status int, retryAfter time.Duration) {
	status, retryAfter = httpStatus(err)
	if retryAfter > 0 {
		retryAfter = wholeSeconds(retryAfter)
	}
	return status, retryAfter
}

// httpStatus is HTTPStatus with the Retry-After as estimated.
func httpStatus(err error) (status int, retryAfter time.Duration) {
	var le *LimitError
	switch {
	case err == nil:
		return http.StatusOK, 0
	case errors.Is(err, ErrExceedsLimit):
		return http.StatusRequestEntityTooLarge, 0
	case errors.As(err, &le):
		return http.StatusTooManyRequests, max(le.RetryAfter, time.Millisecond)
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, time.Second
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest, 0
	case errors.Is(err, ErrBadPriority):
		return http.StatusBadRequest, 0
	}
	var bad *BadRequestError
	if errors.As(err, &bad) {
		return bad.status(), 0
	}
	return http.StatusInternalServerError, 0
}

// ceilMs is d in milliseconds, rounded up, without overflow.
func ceilMs(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

func wholeSeconds(d time.Duration) time.Duration {
	if d < time.Second {
		return time.Second
	}
	if d > math.MaxInt64-time.Second { // rounding up would overflow
		return math.MaxInt64 / time.Second * time.Second
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

// ErrorMessage returns what a client may be told about an admission error:
// the numbers of a rejection, the cap that refused (LimitError.Cap, when
// its owner names one) and its reason, without package prefixes and
// without its key, which may name a tenant or an API key. An error it does
// not know gets a generic message, since its text may carry anything.
func ErrorMessage(err error) string {
	var le *LimitError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &le):
		reason := "limit reached"
		switch {
		case errors.Is(le.Err, ErrQueueFull):
			reason = "queue full"
		case errors.Is(le.Err, ErrWaitTimeout):
			reason = "timed out waiting"
		case errors.Is(le.Err, ErrExceedsLimit):
			if le.Limit == Unlimited {
				return "the request weighs more than its cap can ever hold"
			}
			return fmt.Sprintf("the request weighs more than its cap can ever hold (limit %d)", le.Limit)
		}
		switch le.Cap {
		case "pacing":
			return fmt.Sprintf("waiting for the spacing of starts to the upstream: %d in flight, %d queued (%s)", le.InFlight, le.Queued, reason)
		case "pause":
			return fmt.Sprintf("the upstream asked for a pause in new requests: %d in flight, %d queued (%s)", le.InFlight, le.Queued, reason)
		}
		at := ""
		if le.Cap != "" {
			at = " under the " + le.Cap + " cap"
		}
		if le.Limit == Unlimited {
			return "too many requests in flight" + at + " (" + reason + ")"
		}
		return fmt.Sprintf("too many requests in flight%s: %d of %d, %d queued (%s)", at, le.InFlight, le.Limit, le.Queued, reason)
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out waiting for capacity"
	case errors.Is(err, context.Canceled):
		return "the request was cancelled while waiting for capacity"
	case errors.Is(err, ErrBadPriority):
		return "unknown priority (want interactive, default or batch)"
	}
	var bad *BadRequestError
	if errors.As(err, &bad) {
		return bad.Reason
	}
	return "the request could not be admitted"
}

// BadRequestError is a request refused for its own fault before any cap
// was asked: one whose body or headers do not say what it is for (a
// pacing.Transport that cannot read a request's model, say). HTTPStatus
// maps it to Status (400 Bad Request when 0), ErrorMessage to Reason, which
// a client may be told: it must carry nothing secret.
type BadRequestError struct {
	Status int
	Reason string
}

func (e *BadRequestError) Error() string { return "bad request: " + e.Reason }

func (e *BadRequestError) status() int {
	if e.Status == 0 {
		return http.StatusBadRequest
	}
	return e.Status
}

// An ErrorWriter writes the answer to a request that was not served: it sets
// the Content-Type it writes, calls WriteHeader(status) and writes a body
// carrying message (from ErrorMessage, or the seam's own for an upstream
// failure). A Retry-After header, when there is one, is already set. Use it
// to answer in the format an API's clients expect (WithErrorWriter).
//
// The status is kept even if the writer forgets it: a body written without
// WriteHeader goes out with status, and when the writer returns without
// writing anything, status (and Retry-After) is written for it. A writer
// may still choose another status by calling WriteHeader itself.
type ErrorWriter func(w http.ResponseWriter, status int, message string)

// WritePlainError is the default ErrorWriter: message as text/plain, with
// X-Content-Type-Options: nosniff.
func WritePlainError(w http.ResponseWriter, status int, message string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintln(w, message)
}

// WriteError answers an admission error as HTTPStatus maps it, with a
// Retry-After header when there is one, and ErrorMessage's text as
// WritePlainError writes it. Middleware and ProxyErrorHandler do the same
// in any format (WithErrorWriter).
func WriteError(w http.ResponseWriter, err error) {
	status, retryAfter := httpStatus(err)
	writeError(w, WritePlainError, status, retryAfter, ErrorMessage(err))
}

// HeaderRetryAfterMs is the header that carries a refusal's Retry-After to
// the millisecond, beside Retry-After's whole seconds: the official OpenAI
// and Anthropic SDKs read it first, and turns of a second are too short
// for whole seconds.
const HeaderRetryAfterMs = "Retry-After-Ms"

// SetRetryAfter sets h's Retry-After to d in whole seconds, rounded up
// (at least 1), and its retry-after-ms (HeaderRetryAfterMs) to d in
// milliseconds, rounded up, as the answers of this package do; it sets
// nothing for d <= 0. For an API's own error answers.
func SetRetryAfter(h http.Header, d time.Duration) {
	if d <= 0 {
		return
	}
	h.Set("Retry-After", strconv.FormatInt(int64(wholeSeconds(d)/time.Second), 10))
	h.Set(HeaderRetryAfterMs, strconv.FormatInt(ceilMs(d), 10))
}

// writeError runs ew, making sure the answer goes out with status: a
// writer that writes nothing would otherwise let the server answer 200. A
// retryAfter goes out as SetRetryAfter sets it.
func writeError(w http.ResponseWriter, ew ErrorWriter, status int, retryAfter time.Duration, msg string) {
	sw := &statusWriter{ResponseWriter: w, status: status}
	if retryAfter > 0 {
		SetRetryAfter(w.Header(), retryAfter)
		sw.retryAfter, sw.retryAfterMs = w.Header().Get("Retry-After"), w.Header().Get(HeaderRetryAfterMs)
	}
	ew(sw, status, msg)
	if !sw.wroteHeader {
		sw.writeStatus()
	}
}

// statusWriter holds an ErrorWriter to the status it was given.
type statusWriter struct {
	http.ResponseWriter
	status       int
	retryAfter   string // "" for none
	retryAfterMs string
	wroteHeader  bool // a final (non-1xx) status has gone out
}

func (w *statusWriter) WriteHeader(code int) {
	if code >= 200 {
		w.wroteHeader = true
		w.agree()
	}
	w.ResponseWriter.WriteHeader(code)
}

// agree drops retry-after-ms when the ErrorWriter set a Retry-After of its
// own: clients read the millisecond header first, and it must not
// contradict the writer's.
func (w *statusWriter) agree() {
	if w.retryAfter != "" && w.Header().Get("Retry-After") != w.retryAfter {
		w.Header().Del(HeaderRetryAfterMs)
	}
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.writeStatus()
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) writeStatus() {
	w.wroteHeader = true
	if w.retryAfter != "" && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", w.retryAfter)
		w.Header().Set(HeaderRetryAfterMs, w.retryAfterMs)
	}
	w.agree()
	w.ResponseWriter.WriteHeader(w.status)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ProxyErrorHandler returns a function for httputil.ReverseProxy's
// ErrorHandler when the proxy's Transport is a slots Transport, which marks
// the errors of its admit function. A refusal is answered as Middleware
// answers it: a *LimitError with 429 (or WithRejectStatus's status) and
// Retry-After, a wait cut by the server's deadline with 503 and
// Retry-After, and any other admission error with HTTPStatus's status. A
// *BadRequestError (a request a pacing.Transport could not read) is
// answered with its status and reason. Every other error is the
// upstream's: 504 Gateway Timeout when the
// request's deadline passed while the upstream had it, else 502 Bad
// Gateway. When the client has gone, nothing is written. Without it,
// ReverseProxy answers every rejection with an empty 502.
//
// An admit function with errors of its own (a fleet store that cannot be
// reached, say) wraps the proxy's ErrorHandler to answer those first; left
// to this one they are 500s.
func ProxyErrorHandler(opts ...MiddlewareOption) func(http.ResponseWriter, *http.Request, error) {
	cfg := newMiddlewareConfig(opts)
	return func(w http.ResponseWriter, r *http.Request, err error) {
		if errors.Is(r.Context().Err(), context.Canceled) {
			return // the client has gone: nobody to answer
		}
		var refused *admitError
		var bad *BadRequestError
		switch {
		case errors.As(err, &refused):
			status, retryAfter := cfg.status(refused.err)
			writeError(w, cfg.writeError, status, retryAfter, ErrorMessage(refused.err))
		case errors.As(err, &bad):
			writeError(w, cfg.writeError, bad.status(), 0, bad.Reason)
		case errors.Is(err, context.DeadlineExceeded):
			writeError(w, cfg.writeError, http.StatusGatewayTimeout, 0, "the upstream did not answer in time")
		default:
			writeError(w, cfg.writeError, http.StatusBadGateway, 0, "the upstream could not be reached")
		}
	}
}
