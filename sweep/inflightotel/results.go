package inflightotel

import (
	"context"
	"errors"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// The results of an admission, as inflight.result says them.
const (
	resultAcquired = iota
	resultBypassed
	resultLimitReached
	resultQueueFull
	resultWaitTimeout
	resultCanceled
	resultInvalidKey
	resultExceedsLimit
	resultOverBudget
	resultOther
	results
)

var resultNames = [results]string{"acquired", "bypassed", "limit_reached", "queue_full", "wait_timeout", "canceled", "invalid_key",
	"exceeds_limit", "over_budget", "other"}

// resultErrs are the errors that make each result, whose text describes
// a refusal's span (statusOf).
var resultErrs = [results]error{resultLimitReached: slots.ErrLimitReached, resultQueueFull: slots.ErrQueueFull,
	resultWaitTimeout: slots.ErrWaitTimeout, resultInvalidKey: registry.ErrInvalidKey,
	resultExceedsLimit: slots.ErrExceedsLimit, resultOverBudget: pacing.ErrOverBudget}

// statusOf describes a refusal for err of result r on its span: by the
// error that makes r (for a context's end, the context's error), not by
// err, whose text may name a key (a tenant, an API key) that a trace
// should not carry; by err itself only for a result of other.
func statusOf(err error, r int) string {
	switch {
	case resultErrs[r] != nil:
		return resultErrs[r].Error()
	case r == resultCanceled && errors.Is(err, context.DeadlineExceeded):
		return context.DeadlineExceeded.Error()
	case r == resultCanceled:
		return context.Canceled.Error()
	case err == nil: // a refusal told without its error
		return resultNames[r]
	}
	return utf8Only(err.Error())
}

// resultOf names e's result: by the first error of resultErrs that its
// error wraps, else by a context's end, else other.
func resultOf(e slots.Event) int {
	switch e.Kind {
	case slots.EventAcquired:
		return resultAcquired
	case slots.EventBypassed:
		return resultBypassed
	}
	for r, err := range resultErrs {
		if err != nil && errors.Is(e.Err, err) {
			return r
		}
	}
	if errors.Is(e.Err, context.Canceled) || errors.Is(e.Err, context.DeadlineExceeded) {
		return resultCanceled
	}
	return resultOther
}
