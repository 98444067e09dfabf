package slots

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// A MiddlewareOption configures Middleware and ProxyErrorHandler (nil: none).
type MiddlewareOption interface{ applyMiddleware(*middlewareConfig) }

// middlewareOptionFunc adapts a function to MiddlewareOption.
type middlewareOptionFunc func(*middlewareConfig)

func (f middlewareOptionFunc) applyMiddleware(c *middlewareConfig) { f(c) }

type middlewareConfig struct {
	rejectStatus int
	writeError   ErrorWriter
}

func newMiddlewareConfig(opts []MiddlewareOption) middlewareConfig {
	cfg := middlewareConfig{rejectStatus: http.StatusTooManyRequests, writeError: writeJSONError}
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.applyMiddleware(&cfg)
	}
	return cfg
}

// status is HTTPStatus with the configured status for a rejection; a
// request heavier than its whole cap stays 413 (waiting cannot help). A
// wait cancelled while r's client is still there (the server ended it, as
// a drain does through pacing.WithWaitContext) is no 499, which says the
// client went away: the service is unavailable.
func (c middlewareConfig) status(r *http.Request, err error) (int, time.Duration) {
	status, retryAfter := httpStatus(err)
	if status == StatusClientClosedRequest && r.Context().Err() == nil {
		status = http.StatusServiceUnavailable
	}
	var le *LimitError
	if errors.As(err, &le) && !errors.Is(err, ErrExceedsLimit) {
		status = c.rejectStatus
	}
	return status, retryAfter
}

// WithRejectStatus sets a *LimitError's status (429 by default; 503 to shed
// load; ErrExceedsLimit's stays 413). It panics unless code is 4xx or 5xx.
func WithRejectStatus(code int) MiddlewareOption {
	if code < 400 || code > 599 {
		panic(fmt.Sprintf("slots: WithRejectStatus(%d): a rejection needs a 4xx or 5xx status", code))
	}
	return middlewareOptionFunc(func(c *middlewareConfig) { c.rejectStatus = code })
}

// WithErrorWriter sets the writer of error answers (nil: WriteError's JSON).
func WithErrorWriter(f ErrorWriter) MiddlewareOption {
	return middlewareOptionFunc(func(c *middlewareConfig) {
		if f != nil {
			c.writeError = f
		}
	})
}

// Middleware runs each handler holding a Slot from admit until it returns
// or panics; a refusal is answered as WriteError answers it.
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
				status, retryAfter := cfg.status(r, err)
				writeError(w, cfg.writeError, status, retryAfter, ErrorMessage(err))
				return
			}
			defer s.releaseQuietly()
			next.ServeHTTP(w, r)
		})
	}
}
