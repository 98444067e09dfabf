package slots

import (
	"context"
	"encoding/json"
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
//	*LimitError (any reason)              429, its RetryAfter in whole seconds (at least 1 s)
//	wraps context.DeadlineExceeded        503, 1 s (the server's own deadline passed while waiting)
//	wraps context.Canceled                499, 0 (the client went away)
//	wraps ErrBadPriority                  400, 0 (PlaceFromHeaders met a bad X-Priority)
//	anything else                         500, 0
//
// Retry-After is rounded up, so a client that honours it does not come back
// early.
func HTTPStatus(err error) (status int, retryAfter time.Duration) {
	var le *LimitError
	switch {
	case err == nil:
		return http.StatusOK, 0
	case errors.As(err, &le):
		return http.StatusTooManyRequests, wholeSeconds(le.RetryAfter)
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, time.Second
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest, 0
	case errors.Is(err, ErrBadPriority):
		return http.StatusBadRequest, 0
	}
	return http.StatusInternalServerError, 0
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

// WriteError answers an admission error as HTTPStatus maps it, with a
// Retry-After header when there is one and an OpenAI-style JSON body:
//
//	{"error":{"type":"rate_limit_error","message":"..."}}
//
// The message gives the numbers of a rejection but not its key, which may
// name a tenant or an API key.
func WriteError(w http.ResponseWriter, err error) {
	status, retryAfter := HTTPStatus(err)
	writeError(w, err, status, retryAfter)
}

func writeError(w http.ResponseWriter, err error, status int, retryAfter time.Duration) {
	kind, msg := "api_error", "the request could not be admitted"
	var le *LimitError
	switch {
	case errors.As(err, &le):
		kind = "rate_limit_error"
		msg = fmt.Sprintf("too many requests in flight: %d of %d, %d queued (%v)", le.InFlight, le.Limit, le.Queued, le.Err)
		if le.Limit == Unlimited {
			msg = fmt.Sprintf("too many requests in flight (%v)", le.Err)
		}
	case errors.Is(err, context.DeadlineExceeded):
		kind, msg = "overloaded_error", "timed out waiting for capacity"
	case errors.Is(err, context.Canceled):
		msg = "the request was cancelled while waiting for capacity"
	case errors.Is(err, ErrBadPriority):
		kind, msg = "invalid_request_error", err.Error()
	}
	h := w.Header()
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64(retryAfter/time.Second), 10))
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Type, body.Error.Message = kind, msg
	_ = json.NewEncoder(w).Encode(body)
}

// A MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareConfig)

type middlewareConfig struct {
	rejectStatus int
}

// WithRejectStatus sets the status of a rejection (*LimitError): 429 by
// default; 503 suits a server that sheds load rather than rate-limits.
// Other errors keep the status HTTPStatus gives them. It panics unless code
// is a 4xx or 5xx status.
func WithRejectStatus(code int) MiddlewareOption {
	if code < 400 || code > 599 {
		panic(fmt.Sprintf("slots: WithRejectStatus(%d): a rejection needs a 4xx or 5xx status", code))
	}
	return func(c *middlewareConfig) { c.rejectStatus = code }
}

// Middleware returns HTTP middleware that runs each handler holding a Slot
// from admit, for the handler's whole run: a streaming handler holds it for
// the whole stream. The slot is released when the handler returns or
// panics (the panic goes on up). A request that admit rejects is answered
// as WriteError does, with WithRejectStatus's status for a *LimitError, and
// the handler does not run. It panics if admit is nil.
func Middleware(admit AdmitFunc, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	if admit == nil {
		panic("slots: Middleware needs an admit function")
	}
	cfg := middlewareConfig{rejectStatus: http.StatusTooManyRequests}
	for _, o := range opts {
		o(&cfg)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s, err := admit(r)
			if err != nil {
				s.releaseQuietly() // a slot returned along with an error
				status, retryAfter := HTTPStatus(err)
				var le *LimitError
				if errors.As(err, &le) {
					status = cfg.rejectStatus
				}
				writeError(w, err, status, retryAfter)
				return
			}
			defer s.releaseQuietly()
			next.ServeHTTP(w, r)
		})
	}
}
