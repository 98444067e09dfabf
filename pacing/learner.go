package pacing

import (
	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/learn"
)

// learner learns one lane's cap (see learn.Cap for how) under its Gate's
// lock; the Gate applies Limit to the lane after each change.
type learner struct {
	learn.Cap
	lane       *core.Lane // whose Limit it drives
	model, key string     // the model or the API key of lane; neither for the provider

	timer    *clock.Timer
	timerAt  int64
	timerGen uint64

	changes uint64
	told    LimitChange // the cap and ceiling last reported
	ev      Evidence    // the answer behind the change not yet reported, if any
}

// newLearner returns a learner of a's cap, configured at most; seq numbers
// the Gate's last start: those up to it were made under a cap it did not
// set, so their answers are no evidence of its own (see learn.Cap.CutSeq).
func newLearner(a *AdaptiveConfig, configured int, seq uint64) *learner {
	l := &learner{Cap: *learn.FromMS(a.Min, a.Max, a.Initial, a.RetestMS).New(configured)}
	l.CutSeq = seq
	return l
}

func (l *learner) configure(a *AdaptiveConfig, configured int) {
	learn.FromMS(a.Min, a.Max, a.Initial, a.RetestMS).Configure(&l.Cap, configured)
}

// started notes a start with n in flight on l's lane at now, and applies
// the limit that follows; a nil learner (the lane learns nothing) does
// nothing.
func (l *learner) started(n int, now int64) {
	if l != nil {
		l.Started(n, now)
		l.lane.Limit = l.Limit(now)
	}
}

// stop stops the timer; a nil learner has none.
func (l *learner) stop() {
	if l != nil && l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}
