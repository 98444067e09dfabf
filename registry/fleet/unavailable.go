package fleet

// Admissions while the store cannot be reached (the breaker is open, or a
// call failed), as WithUnavailable says.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// bypass admits l with a Bypassed Slot that holds nothing (Degraded too if
// the store is unavailable).
func (r *Registry[K]) bypass(l *lease[K], degraded bool) outcome {
	x := new(core.Handle)
	h := x.Hold()
	h.Owner, l.hold = l, h
	h.At = time.Now().UnixNano()
	h.Bypassed, h.Degraded, h.Extra = true, degraded, int32(l.units-1)
	r.stats.bypassed.Add(1)
	return outcome{slot: (*slots.Slot)(x), full: -1}
}

// unqueued is unavailable for l, waiting as w, after its call was not
// made or failed: it may be admitted outside the store, so w, if queued
// under l's id, leaves the fleet's queue first and l takes a new id, which
// the ticket's tombstone does not keep out when it is put back.
func (r *Registry[K]) unqueued(ctx context.Context, l *lease[K], w *waiter) outcome {
	if r.leaveQueue(l, w) {
		l.id = newLeaseID() // l is not shared yet
	}
	return r.unavailable(ctx, l)
}

// unavailable admits l, or not, while the store cannot be reached.
func (r *Registry[K]) unavailable(ctx context.Context, l *lease[K]) outcome {
	switch r.cfg.onUnavailable {
	case FailClosed:
		return failed(ErrUnavailable)
	case FailOpen:
		if err := ctx.Err(); err != nil {
			return failed(fmt.Errorf("fleet: acquire: %w", err))
		}
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		if closed {
			return failed(ErrClosed)
		}
		return r.bypass(l, true)
	}
	return r.hold(ctx, l, true, 0)
}

// timedOut reports whether err is a call's timeout: the call's own
// deadline, a network timeout, or a queued call not sent in time.
func timedOut(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errQueueTimeout) || errors.As(err, &t) && t.Timeout()
}

func (r *Registry[K]) storeFailed(err error) {
	if r.stopping.Err() != nil {
		return // Close cancelled it: not the store's failure
	}
	r.stats.storeErrors.Add(1)
	if r.brk.failure() {
		r.logSafely(slog.LevelWarn, "fleet: store unavailable; breaker open", slog.String("registry", r.prefix), slog.Any("error", err))
	}
}
