package learn

import (
	"fmt"
	"testing"

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
