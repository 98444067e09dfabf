package slots

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

const (
	StatusClientClosedRequest = 499              // answers a client gone while it waited (nginx)
	HeaderRetryAfterMs        = "Retry-After-Ms" // Retry-After in ms, which the OpenAI SDKs read first
)

// HTTPStatus maps an admission error to the answer an HTTP layer gives:
//
//	nil                                   200, 0
//	wraps ErrExceedsLimit                 413, 0 (waiting cannot help)
//	*LimitError (any other reason)        429, RetryAfter rounded up to seconds
//	wraps context.DeadlineExceeded        503, its RetryAfter() or else 1 s (a server's deadline passed)
//	wraps context.Canceled                499, 0 (the client went away)
//	wraps ErrBadPriority, ErrInvalidKey   400, 0 (registry.ErrInvalidKey: the request's key)
//	*BadRequestError                      its Status (400 by default), 0
//	has a RetryAfter() time.Duration      503, it (a fleet's store cannot be reached)
//	wraps ErrNotSent (and none of these)  503, 0
//	anything else                         500, 0
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
		return http.StatusServiceUnavailable, cmp.Or(retryLater(err), time.Second)
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest, 0
	case errors.Is(err, ErrBadPriority), errors.Is(err, core.ErrInvalidKey): // a key from the request, too long
		return http.StatusBadRequest, 0
	}
	var bad *BadRequestError
	if errors.As(err, &bad) {
		return bad.status(), 0
	}
	if d := retryLater(err); d > 0 {
		return http.StatusServiceUnavailable, d
	}
	if errors.Is(err, ErrNotSent) { // a base's refusal that says no more
		return http.StatusServiceUnavailable, 0
	}
	return http.StatusInternalServerError, 0
}

// retryLater is the RetryAfter() of an error in err's tree that has one,
// at least 1 ms; else 0.
func retryLater(err error) time.Duration {
	var later interface{ RetryAfter() time.Duration }
	if !errors.As(err, &later) {
		return 0
	}
	return max(later.RetryAfter(), time.Millisecond)
}

// ceilIn is d in units of unit, rounded up, without overflow (in an
// int64, where rounding d itself up to a whole unit could pass the largest
// Duration).
func ceilIn(d, unit time.Duration) int64 {
	n := int64(d / unit)
	if d%unit > 0 {
		n++
	}
	return n
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

// ErrorMessage tells an admission error to a client, without its key.
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
		// A budget per minute (pacing's and a fleet's Caps end so) counts
		// what started in the last minute, not what is in flight.
		if strings.HasSuffix(le.Cap, "_per_minute") {
			what := "tokens"
			if strings.HasSuffix(le.Cap, "requests_per_minute") {
				what = "requests"
			}
			msg := fmt.Sprintf("over the %s budget: %d of %d %s started in the last minute", le.Cap, le.InFlight, le.Limit, what)
			if errors.Is(le.Err, ErrQueueFull) || errors.Is(le.Err, ErrWaitTimeout) { // else "over budget" says it
				msg += " (" + reason + ")"
			}
			return msg
		}
		switch le.Cap {
		case "pacing":
			return fmt.Sprintf("waiting for the spacing of starts to the upstream: %d in flight, %d queued (%s)", le.InFlight, le.Queued, reason)
		case "pause":
			return fmt.Sprintf("the upstream asked for a pause in new requests: %d in flight, %d queued (%s)", le.InFlight, le.Queued, reason)
		case "fleet_pause": // registry/fleet's CapPaused
			return "new requests wait while the fleet's store takes back the requests in flight it lost"
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

// BadRequestError refuses a request for its own fault (a pacing.Transport
// that cannot read its model): Status (400 when 0) and Reason, no secret.
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

// An ErrorWriter writes a refused request's answer in an API's format
// (Retry-After is set); one that forgets WriteHeader still answers status.
type ErrorWriter func(w http.ResponseWriter, status int, message string)

// WritePlainError is an ErrorWriter of message as text/plain.
func WritePlainError(w http.ResponseWriter, status int, message string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintln(w, message)
}

// ErrorType names an error answered with status in the LLM APIs' shape.
func ErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "overloaded_error"
	case status >= 400 && status < 500:
		return "invalid_request_error"
	}
	return "api_error"
}

// writeJSONError is the default ErrorWriter: the error shape of the LLM
// APIs (OpenAI's, Anthropic's), which their clients' SDKs read, the type
// named after the status (ErrorType).
func writeJSONError(w http.ResponseWriter, status int, message string) {
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Type, body.Error.Message = ErrorType(status), message
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // not sniffed (nosniff): "<" reads as written
	_ = enc.Encode(body)
}

// WriteError answers an admission error as Middleware does, in JSON:
// {"error":{"type":"rate_limit_error","message":...}} (type by status).
func WriteError(w http.ResponseWriter, err error) {
	status, retryAfter := httpStatus(err)
	writeError(w, writeJSONError, status, retryAfter, ErrorMessage(err))
}

// SetRetryAfter sets Retry-After and HeaderRetryAfterMs to d > 0, rounded up.
func SetRetryAfter(h http.Header, d time.Duration) {
	if d <= 0 {
		return
	}
	h.Set("Retry-After", strconv.FormatInt(ceilIn(d, time.Second), 10))
	h.Set(HeaderRetryAfterMs, strconv.FormatInt(ceilIn(d, time.Millisecond), 10))
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
	// An ErrorWriter's own Retry-After keeps its own ms, not the library's.
	if w.retryAfter != "" && w.Header().Get("Retry-After") != w.retryAfter && slices.Equal(w.Header().Values(HeaderRetryAfterMs), []string{w.retryAfterMs}) {
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

// FlushError writes the status first, if nothing has yet: a flush would
// send the server's 200. http.ResponseController calls it.
func (w *statusWriter) FlushError() error {
	if !w.wroteHeader {
		w.writeStatus()
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for an http.Flusher.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// ProxyErrorHandler returns a ReverseProxy ErrorHandler for a slots Transport:
// a refusal answered as by Middleware, others as the upstream's (504 past the
// deadline, else 502); none to a client gone; a dropped 101 closed.
func ProxyErrorHandler(opts ...MiddlewareOption) func(http.ResponseWriter, *http.Request, error) {
	cfg := newMiddlewareConfig(opts)
	return func(w http.ResponseWriter, r *http.Request, err error) {
		var refused *admitError
		var bad *BadRequestError
		if !errors.As(err, &refused) && !errors.As(err, &bad) { // those come before any answer
			closeUnusedUpgrades(r.Context())
		}
		if errors.Is(r.Context().Err(), context.Canceled) {
			return // the client has gone: nobody to answer
		}
		switch {
		case errors.As(err, &refused):
			status, retryAfter := cfg.status(r, refused.err)
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
