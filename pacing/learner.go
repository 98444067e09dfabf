package pacing

import (
	"time"

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

func newLearner(a *AdaptiveConfig, configured int) *learner {
	floor, ceil, retest := a.settings(configured)
	init := a.Initial
	if init == 0 {
		init = DefaultAdaptiveInitial
	}
	return &learner{Cap: *learn.New(floor, ceil, init, retest)}
}

func (l *learner) configure(a *AdaptiveConfig, configured int) {
	l.Configure(a.settings(configured))
}

// settings returns the floor, the ceiling and the re-test interval of a
// cap learned under a, with a configured cap (0: none).
func (a *AdaptiveConfig) settings(configured int) (floor, ceil int, retest time.Duration) {
	floor, ceil = a.bounds(configured)
	retest = time.Duration(a.RetestMS) * time.Millisecond
	if retest == 0 {
		retest = DefaultRetest
	}
	return floor, ceil, retest
}

// stop stops the timer; a nil learner has none.
func (l *learner) stop() {
	if l != nil && l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}
