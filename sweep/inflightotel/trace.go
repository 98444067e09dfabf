package inflightotel

import (
	"context"
	"time"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// Trace returns a pacing.Trace that tells c of one request a
// pacing.Transport sends under ctx (the request's context, with its span,
// priority and flow), as c's Observe is told of a Limiter's admissions:
// its admission and the time it waited (for a fleet's caps and the Gate's
// together), or its refusal and the time it waited until then, each on the
// request's trace when ctx carries a recording span; then its slots'
// release and how long they were held. Attach it beside the program's own
// with pacing.WithTrace(ctx, c.Trace(ctx)): the wait is timed from its
// start (pacing.Trace.Waiting; from here, for a refusal that comes before
// it). It is nil, and pacing.WithTrace adds
// nothing, when c records nothing (no SDK installed, and no recording span
// in ctx): a request then costs nothing more.
func (c *Cap) Trace(ctx context.Context) *pacing.Trace {
	if !c.Enabled(ctx) {
		return nil
	}
	start := time.Now()
	return &pacing.Trace{
		Waiting: func() { start = time.Now() },
		Admitted: func(a pacing.Admission) {
			kind := slots.EventAcquired
			if a.Held.Bypassed() {
				kind = slots.EventBypassed
			}
			c.Observe(slots.Event{Kind: kind, Wait: a.Wait, Context: ctx})
		},
		Refused: func(err error) {
			c.Observe(slots.Event{Kind: slots.EventRejected, Err: err, Wait: time.Since(start), Context: ctx})
		},
		Released: func(a pacing.Admission, held time.Duration) {
			c.Observe(slots.Event{Kind: slots.EventReleased, Hold: held, Units: a.Held.Units()})
		},
	}
}
