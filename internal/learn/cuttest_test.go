package learn

import (
	"testing"
	"time"
)

// The test of a cut is withdrawn by its own failure, not by another
// start's that has the same count: with a floor of 2, a start within the
// floor goes while the test is out, and fails.
func TestCutTestWithdrawnOnlyByItsOwnAnswer(t *testing.T) {
	ms := int64(time.Millisecond)
	c := New(2, 10, 6, time.Minute)
	for id := uint64(1); id <= 6; id++ {
		c.Started(int(id), int64(id)*ms)
	}
	c.Refused(6, 6, 6*ms, 100*ms, 6) // a cut
	c.Started(2, 200*ms)             // start 7 tests it
	c.Started(2, 210*ms)             // start 8, within the floor
	c.Inconclusive(2, 8, 210*ms)
	if c.ProbeN == 0 || c.Limit(220*ms) != 2 {
		t.Fatalf("start 8's failure withdrew the test of the cut (start 7): limit %d, %+v", c.Limit(220*ms), c)
	}
	c.Inconclusive(2, 7, 200*ms)
	if c.ProbeN != 0 {
		t.Fatalf("the test's own failure did not withdraw it: %+v", c)
	}
}

// A floor over the ceiling is taken as the ceiling: the test of a cut,
// whose limit is the floor, stays within it.
func TestFloorOverTheCeiling(t *testing.T) {
	c := New(4, 2, 2, time.Minute)
	for id := uint64(1); id <= 2; id++ {
		c.Started(int(id), int64(id))
	}
	c.Refused(2, 2, 2, 100, 2)
	c.Started(1, 200)
	if got := c.Limit(200); got > 2 {
		t.Fatalf("limit %d over the ceiling 2: %+v", got, c)
	}
}
