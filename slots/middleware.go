package slots

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// A MiddlewareOption configures Middleware and ProxyErrorHandler.
type MiddlewareOption func(*middlewareConfig)

type middlewareConfig struct {
	rejectStatus int
	writeError   ErrorWriter
}

func newMiddlewareConfig(opts []MiddlewareOption) middlewareConfig {
	cfg := middlewareConfig{rejectStatus: http.StatusTooManyRequests, writeError: WritePlainError}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// status is HTTPStatus with the configured status for a rejection.
func (c middlewareConfig) status(err error) (int, time.Duration) {
	status, retryAfter := httpStatus(err)
	var le *LimitError
	if errors.As(err, &le) {
		status = c.rejectStatus
	}
	return status, retryAfter
}

// WithRejectStatus sets the status of a rejection (*LimitError): 429 by
// default; 503 suits a server that sheds load rather than rate-limits.
// Other errors keep the status HTTPStatus gives them. ProxyErrorHandler
// answers a rejection with code as Middleware does, whatever it is: a 5xx
// is not taken for an upstream failure, nor 499 for a client gone. It
// panics unless code is a 4xx or 5xx status.
func WithRejectStatus(code int) MiddlewareOption {
	if code < 400 || code > 599 {
		panic(fmt.Sprintf("slots: WithRejectStatus(%d): a rejection needs a 4xx or 5xx status", code))
	}
	return func(c *middlewareConfig) { c.rejectStatus = code }
}

// WithErrorWriter sets how the body of an error answer is written (by
// default WritePlainError's text). A nil f keeps the default.
func WithErrorWriter(f ErrorWriter) MiddlewareOption {
	return func(c *middlewareConfig) {
		if f != nil {
			c.writeError = f
		}
	}
}

// Middleware returns HTTP middleware that runs each handler holding a Slot
// from admit, for the handler's whole run: a streaming handler holds it for
// the whole stream. The slot is released when the handler returns or
// panics (the panic goes on up). A request that admit rejects is answered
// with HTTPStatus's status (WithRejectStatus's for a *LimitError), a
// Retry-After header when there is one, and ErrorMessage's text written by
// the ErrorWriter (WithErrorWriter); the handler does not run. It panics if
// admit is nil.
func Middleware(admit AdmitFunc, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	if admit == nil {
		panic("slots: Middleware needs an admit function")
	}
	cfg := newMiddlewareConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s, err := admit(r)
			if err != nil {
				s.releaseQuietly() // a slot returned along with an error
				status, retryAfter := cfg.status(err)
				writeError(w, cfg.writeError, status, retryAfter, ErrorMessage(err))
				return
			}
			defer s.releaseQuietly()
			next.ServeHTTP(w, r)
		})
	}
}
