package learn

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRoute states the rule for every kind of answer, for the most specific
// learned cap of a request and for the others.
func TestRoute(t *testing.T) {
	cases := []struct {
		kind             Kind
		specific, others Step
	}{
		{KindAdmitted, Proved, Proved},
		{KindConcurrency, Cut, Withdrawn},
		{KindOverload, Eased, Withdrawn},
		{KindOther, Withdrawn, Withdrawn},
		// A rate limit's or a quota's refusal proves nothing of a cap in
		// flight: a probe it answered is withdrawn, not taken for admitted.
		{KindRate, Withdrawn, Withdrawn},
		{KindQuota, Withdrawn, Withdrawn},
		{Kind(200), Withdrawn, Withdrawn},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.kind), func(t *testing.T) {
			assert.Equal(t, c.specific, Route(c.kind, true), "the most specific cap")
			assert.Equal(t, c.others, Route(c.kind, false), "the others")
		})
	}
}

// TestTake: each step changes a cap as the method it stands for does.
func TestTake(t *testing.T) {
	const at, now = int64(1e9), int64(2e9)
	for _, c := range []struct {
		step Step
		by   func(*Cap)
	}{
		{Proved, func(l *Cap) { l.Admitted(12, 7, 8) }},
		{Cut, func(l *Cap) { l.Refused(12, 7, at, now, 8) }},
		{Eased, func(l *Cap) { l.Overloaded(7, 8) }},
		{Withdrawn, func(l *Cap) { l.Inconclusive(12, 7, at) }},
	} {
		t.Run(fmt.Sprint(c.step), func(t *testing.T) {
			taken, called, untouched := New(1, 64, 9, time.Minute), New(1, 64, 9, time.Minute), New(1, 64, 9, time.Minute)
			for _, l := range []*Cap{taken, called, untouched} {
				l.Started(12, at)
			}
			taken.Take(Answer{Step: c.step, N: 12, ID: 7, Seq: 8, At: at, Now: now})
			c.by(called)
			assert.Equal(t, *called, *taken)
			if c.step != Withdrawn {
				assert.NotEqual(t, *untouched, *taken, "the step changed nothing: the test shows nothing")
			}
		})
	}
}
