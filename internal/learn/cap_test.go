package learn

import (
	"testing"
	"time"
)

func TestValid(t *testing.T) {
	c := New(1, 64, 4, 10*time.Second)
	if !c.Valid() {
		t.Fatalf("a new Cap is valid: %+v", c)
	}
	for name, bad := range map[string]func(*Cap){
		"zero value": func(c *Cap) { *c = Cap{} },
		"no step":    func(c *Cap) { c.Step = 0 },
		"cap 0":      func(c *Cap) { c.Lo = 0 },
		"streak < 0": func(c *Cap) { c.Streak = -1 },
		"dev < 0":    func(c *Cap) { c.RefusalDev = -1 },
		"batch < 0":  func(c *Cap) { c.BatchTop = -1 },
		// Past what the learner makes (a refusal counts as maxGap at
		// most), where Gap would overflow.
		"step too wide":    func(c *Cap) { c.Step = maxStep + 1 },
		"refusal too long": func(c *Cap) { c.Refusal = maxGap + 1 },
		"dev too long":     func(c *Cap) { c.RefusalDev = maxGap + 1 },
	} {
		c := New(1, 64, 4, 10*time.Second)
		bad(c)
		if c.Valid() {
			t.Errorf("%s: valid: %+v", name, c)
		}
	}
	// The learner's own bounds: a batch maxStep wide, a refusal timed at
	// maxGap or more.
	c = New(1, 64, 4, 10*time.Second)
	c.Step = maxStep
	timeRefusals(c, new(int64), time.Hour)
	if c.Refusal != maxGap || !c.Valid() {
		t.Fatalf("at the learner's bounds (refusal %v): not valid: %+v", c.Refusal, c)
	}
}

// A probe is taken as admitted only once its refusal would be later than
// nearly any seen: after refusals of 10 ms and one of 80 ms, a probe
// unanswered for 60 ms is still out (twice the moving average alone would
// have taken it as admitted at 40 ms), and one unanswered for 90 ms counts.
func TestGapCoversVaryingRefusals(t *testing.T) {
	ms := int64(time.Millisecond)
	c := New(1, 64, 4, 10*time.Second)
	now := int64(0)
	for _, d := range []time.Duration{10, 10, 10, 10, 80, 10, 10} {
		timeRefusals(c, &now, d*time.Millisecond)
	}
	if c.Gap() <= 60*time.Millisecond || c.Gap() >= 90*time.Millisecond {
		t.Fatalf("gap %v after refusals of 10 ms and one of 80 ms: want between 60 and 90 ms", c.Gap())
	}
	// A batch of probes goes out: demand fills Lo, and the limit lets one over.
	lo := c.Lo
	if !c.MayProbe(now) {
		t.Fatalf("no probe may go: %+v", c)
	}
	c.Started(lo+1, now)
	c.Tick(now+60*ms, 1)
	if c.ProbeN == 0 || c.Lo != lo {
		t.Fatalf("a probe unanswered for 60 ms was taken as admitted: %+v", c)
	}
	c.Tick(now+90*ms, 1)
	if c.ProbeN != 0 || c.Lo != lo+1 {
		t.Fatalf("a probe unanswered for 90 ms is still out: %+v", c)
	}
}

// timeRefusals has c take refusals that took d each, a second apart from
// *now on, of a start numbered 0: before any cut, so they time refusals
// and move nothing else.
func timeRefusals(c *Cap, now *int64, ds ...time.Duration) {
	for _, d := range ds {
		*now += int64(time.Second)
		c.Refused(c.Lo, 0, *now-int64(d), *now, 0)
	}
}

// While refusals take the same time, the gap is twice it.
func TestGapSteadyRefusals(t *testing.T) {
	c := New(1, 64, 4, 10*time.Second)
	now := int64(0)
	for range 20 {
		timeRefusals(c, &now, 50*time.Millisecond)
	}
	if c.Gap() < 100*time.Millisecond || c.Gap() > 101*time.Millisecond {
		t.Fatalf("gap %v with every refusal 50 ms: want 100 ms", c.Gap())
	}
}

// A retest admitted reopens the ceiling, but the cap stays at it, and the
// next batch is one probe at the retest's count: a count one over what the
// upstream had (an end the client has not seen yet, or in a fleet a
// release on its way to the store) can pass a retest of an unchanged cap,
// and a cap raised to it would have starts over the upstream's refused.
// Batches widen again as they are admitted.
func TestRetestAdmittedClimbsOneAtATime(t *testing.T) {
	s := &starts{c: New(1, 64, 20, 10*time.Second)}
	c := s.c
	// A probe at 21 refused: the ceiling is 20.
	now := sec
	s.refuse(21, now)
	if c.Lo != 20 || c.Hi != 20 {
		t.Fatalf("after a refusal at 21: %+v", c)
	}
	now = s.retestAdmitted(t, now)
	// The probe at 21 admitted too: the cap is 21, and the next batch is
	// two wide.
	s.admitted(21, s.start(21, now))
	if got := c.Limit(now); c.Lo != 21 || got != 23 {
		t.Fatalf("limit %d after the probe at 21 admitted: want 23 (%+v)", got, c)
	}
}

// A retest admitted on a count over what the upstream has: the probe that
// follows it, at the same count, is refused, and the cap stays at the
// ceiling with no start refused within it, so the cap is not cut.
func TestRetestAdmittedOverTheUpstreamsCount(t *testing.T) {
	s := &starts{c: New(1, 64, 20, 10*time.Second)}
	c := s.c
	now := sec
	s.refuse(21, now)
	now = s.retestAdmitted(t, now)
	s.refuse(21, now)
	if c.Lo != 20 || c.Hi != 20 || c.Streak != 0 {
		t.Fatalf("after the probe that followed the retest refused: %+v, want the cap and ceiling 20 and no cut", c)
	}
	if got := c.Limit(now); got != 20 {
		t.Fatalf("limit %d after the probe refused: want 20 until the next retest", got)
	}
}

// The same when the retest is taken as admitted because its refusal came
// later than the gap (a slow answer, or in a fleet one that reached this
// process through the store): the refusal, once it comes, sets the
// ceiling back, and cuts nothing.
func TestRetestTakenAsAdmittedThenRefused(t *testing.T) {
	s, now := retestDue()
	c := s.c
	retest := s.start(21, now)
	now += int64(c.Gap())
	c.Tick(now, s.seq)
	if got := c.Limit(now); c.Lo != 20 || c.Hi != c.Ceil || got != 21 {
		t.Fatalf("limit %d after the retest taken as admitted: want the cap 20, no ceiling and a probe at 21 (%+v)", got, c)
	}
	probe := s.start(21, now)
	ms := int64(time.Millisecond)
	c.Refused(21, retest, now-int64(c.Gap()), now+ms, s.seq)
	if got := c.Limit(now + 2*ms); c.Lo != 20 || c.Hi != 20 || c.Streak != 0 || got != 20 {
		t.Fatalf("limit %d after the retest's refusal came late: %+v, want the cap, ceiling and limit 20 and no cut", got, c)
	}
	// The probe made meanwhile is withdrawn: neither time nor its
	// answer, made at the count refused, proves it.
	c.Tick(now+int64(c.Gap())+ms, s.seq)
	s.admitted(21, probe)
	if got := c.Limit(now + int64(c.Gap()) + 2*ms); c.Hi != 20 || got != 20 {
		t.Fatalf("limit %d after the probe made before the retest's refusal was admitted: %+v, want the ceiling 20 until the next retest", got, c)
	}
	// Or refused: the same.
	c2 := *c
	c2.Refused(21, probe, now, now+2*ms, s.seq)
	if c2.Lo != 20 || c2.Hi != 20 || c2.Streak != 0 {
		t.Fatalf("after the retest's refusal came late, and the probe's: %+v, want the cap and ceiling 20 and no cut", c2)
	}
}

// A refused batch's starts are not taken for a reopening's when the
// ceiling is at the bound again (a process configured with a lower max):
// one of its refusals come again does not lower the ceiling.
func TestRefusedBatchIsNoReopening(t *testing.T) {
	s := &starts{c: New(1, 64, 16, 10*time.Second)}
	c := s.c
	c.Step = 4
	now := sec
	ids := map[int]uint64{}
	for n := 17; n <= 20; n++ {
		ids[n] = s.start(n, now)
	}
	ans := now + int64(50*time.Millisecond)
	c.Refused(17, ids[17], now, ans, s.seq)
	c.Refused(20, ids[20], now, ans, s.seq)
	if c.Hi != 18 {
		t.Fatalf("after refusals at 17 and 20 of a batch up to 20: %+v, want the ceiling 18", c)
	}
	c.Configure(1, 18, c.Retest) // the ceiling is the bound now
	now = ans + 2*int64(c.Gap())
	s.start(c.Limit(now), now) // the next batch: none is counted
	if c.BatchTop != 0 || c.Hi != c.Ceil {
		t.Fatalf("the next batch: %+v", c)
	}
	c.Refused(17, ids[17], now, now, s.seq)
	if c.Hi != 18 {
		t.Fatalf("the batch's refusal at 17 come again: %+v, want the ceiling 18", c)
	}
}

// A count admitted over a known ceiling withdraws a batch out over it (a
// start made under a limit from before the ceiling was found): time does
// not take it for admitted.
func TestReopeningWithdrawsABatchOver(t *testing.T) {
	c := New(1, 64, 16, 10*time.Second)
	c.Hi, c.HiAt = 20, sec
	now := 2 * sec
	c.Started(22, now)
	c.Admitted(21, 1, 2)
	c.Tick(now+int64(time.Second), 2)
	if c.Lo != 20 || c.ProbeN != 0 {
		t.Fatalf("after an admission at 21 over the ceiling 20, with a start at 22 out: %+v, want the cap 20 and no batch out", c)
	}
}

// After a cut, a start over the cap made by another process of a fleet
// (under the limit it had before the cut reached it) is taken for the cut's
// test; refused, it tested nothing: time does not take it for admitted,
// and the next start tests the cut.
func TestCutsTestOverTheCapRefused(t *testing.T) {
	s, now := cutThrice(t)
	c := s.c
	lo, streak := c.Lo, c.Streak
	over := s.start(lo+3, now)
	if c.ProbeN != lo+3 {
		t.Fatalf("the start at %d after the cut: %+v, want it taken for the cut's test", lo+3, c)
	}
	c.Refused(lo+3, over, now, now+int64(50*time.Millisecond), s.seq)
	c.Tick(now+int64(time.Second), s.seq)
	if c.Streak != streak || c.Lo != lo || c.ProbeN != 0 {
		t.Fatalf("after the test over the cap refused and a second: %+v, want the cut (streak %d, cap %d) with no test out", c, streak, lo)
	}
	s.start(lo, now+int64(time.Second))
	if c.ProbeN != lo {
		t.Fatalf("the next start: %+v, want it the cut's test", c)
	}
}

// A start made before the retest and refused within the cap after the
// retest was admitted is a refusal within the cap as any other: the cap
// fell, or it is noise, and it is cut.
func TestRefusalWithinTheCapAfterAReopening(t *testing.T) {
	s, now := retestDue()
	c := s.c
	early := s.start(18, now)
	s.admitted(21, s.start(21, now))
	c.Refused(18, early, now, now+int64(50*time.Millisecond), s.seq)
	if c.Lo != 17 || c.Streak != 1 {
		t.Fatalf("after a refusal at 18 of a start made before the reopening: %+v, want the cap cut to 17", c)
	}
}

// The retest's admission told twice (a fleet may apply evidence again)
// proves its count once; a refusal of a start made before the retest, at
// its count, does not set the ceiling back as the retest's own would.
func TestRetestAdmittedTwiceProvesOnce(t *testing.T) {
	s, now := retestDue()
	c := s.c
	before := s.seq // the probe refused at 21
	retest := s.start(21, now)
	s.admitted(21, retest)
	s.admitted(21, retest)
	if got := c.Limit(now); c.Lo != 20 || c.Hi != c.Ceil || got != 21 {
		t.Fatalf("limit %d after the retest's admission told twice: want the cap 20, no ceiling and 21 (%+v)", got, c)
	}
	c.Refused(21, before, now-sec, now, s.seq)
	if c.Hi != c.Ceil {
		t.Fatalf("a refusal of the start before the retest, told again: %+v, want no ceiling", c)
	}
}

// The retest taken as admitted unanswered, and then the probe at its count
// too: the cap climbs, the next batch two wide.
func TestRetestAndProbeTakenAsAdmitted(t *testing.T) {
	s, now := retestDue()
	c := s.c
	for range 2 {
		s.start(21, now)
		now += int64(c.Gap())
		c.Tick(now, s.seq)
	}
	if got := c.Limit(now); c.Lo != 21 || c.Hi != c.Ceil || got != 23 {
		t.Fatalf("limit %d after the retest and the probe at 21 taken as admitted: want the cap 21 and 23 (%+v)", got, c)
	}
}

// A count admitted over a known ceiling while the climb to it is under way
// (a start another process made, or one over what the upstream had) takes
// the cap to the ceiling, not to the count.
func TestAdmittedOverTheCeilingMidClimb(t *testing.T) {
	c := New(1, 64, 12, 10*time.Second)
	c.Hi, c.HiAt = 16, sec
	c.Admitted(18, 1, 1)
	if c.Lo != 16 || c.Hi != c.Ceil || c.Step != 1 {
		t.Fatalf("after an admission at 18 under a ceiling of 16: %+v, want the cap 16, no ceiling and a batch one wide", c)
	}
	c.Admitted(18, 2, 2)
	if c.Lo != 18 {
		t.Fatalf("after a second admission at 18: %+v, want the cap 18", c)
	}
}

const sec = int64(time.Second)

// retestDue has a cap of 20 under the ceiling a probe refused at 21 found,
// and returns the time its retest is due.
func retestDue() (*starts, int64) {
	s := &starts{c: New(1, 64, 20, 10*time.Second)}
	s.refuse(21, sec)
	return s, sec + int64(s.c.Retest) + sec
}

// starts numbers the starts of c, as its owner does.
type starts struct {
	c   *Cap
	seq uint64
}

// start notes a start with n in flight, and returns its number.
func (s *starts) start(n int, now int64) uint64 {
	s.seq++
	s.c.Started(n, now)
	return s.seq
}

// admitted has the upstream admit start number id, with n in flight.
func (s *starts) admitted(n int, id uint64) { s.c.Admitted(n, id, s.seq) }

// refuse starts one with m in flight, refused 50 ms later.
func (s *starts) refuse(m int, now int64) {
	id := s.start(m, now)
	s.c.Refused(m, id, now, now+int64(50*time.Millisecond), s.seq)
}

// retestAdmitted waits out the retest of the ceiling that Lo is at and
// has the upstream admit it: the next batch is one probe wide. It returns
// the time of the retest.
func (s *starts) retestAdmitted(t *testing.T, now int64) int64 {
	t.Helper()
	c := s.c
	lo := c.Lo
	now += int64(c.Retest) + sec
	if got := c.Limit(now); got != lo+1 {
		t.Fatalf("limit %d when the retest is due, want %d (%+v)", got, lo+1, c)
	}
	s.admitted(lo+1, s.start(lo+1, now))
	if c.Lo != lo || c.Hi != c.Ceil {
		t.Fatalf("after the retest admitted: %+v, want the cap %d and no ceiling", c, lo)
	}
	if got := c.Limit(now); got != lo+1 {
		t.Fatalf("limit %d after the retest admitted: the next batch is one probe at its count, want %d (%+v)", got, lo+1, c)
	}
	return now
}

// After a cut, the climb back to its ceiling widens its batches; a retest
// admitted over that ceiling still sends one probe next, not a batch as
// wide as the climb's last.
func TestRetestAdmittedAfterACutClimbsOneAtATime(t *testing.T) {
	s, now := climbedAfterACut(t)
	s.retestAdmitted(t, now)
}

// The same when the retest's batch was withdrawn before its answer came (a
// start made meanwhile at the same count failed): its admission reopens
// the ceiling, and the next batch is one probe.
func TestRetestAdmittedAfterItsBatchWasWithdrawn(t *testing.T) {
	s, now := climbedAfterACut(t)
	c := s.c
	now += int64(c.Retest) + sec
	retest := s.start(17, now)
	other := s.start(17, now+int64(time.Millisecond))
	c.Inconclusive(17, other, now+int64(time.Millisecond))
	if c.ProbeN != 0 {
		t.Fatalf("the batch is still out after a failure at its count: %+v", c)
	}
	s.admitted(17, retest)
	if got := c.Limit(now); c.Lo != 16 || got != 17 {
		t.Fatalf("limit %d after the retest admitted: the next batch is one probe at its count, want 17 (%+v)", got, c)
	}
}

// cutThrice refuses a cap of 20 three times before any admission: it
// halves, to 8 under a ceiling of 16. It returns the time after.
func cutThrice(t *testing.T) (*starts, int64) {
	t.Helper()
	s := &starts{c: New(1, 64, 20, 10*time.Second)}
	now := sec
	for _, m := range []int{20, 19, 17} {
		s.refuse(m, now)
		now += sec
	}
	if c := s.c; c.Lo != 8 || c.Hi != 16 || c.Streak != 3 {
		t.Fatalf("after three refusals: %+v", c)
	}
	return s, now
}

// climbedAfterACut cuts a cap of 20 three times (it halves, to 8 under a
// ceiling of 16), and climbs back to the ceiling in batches that the
// upstream admits (9, up to 11, up to 15, up to 16), which leaves the
// batches wider than one. It returns the time of the last.
func climbedAfterACut(t *testing.T) (*starts, int64) {
	t.Helper()
	s, now := cutThrice(t)
	c := s.c
	s.admitted(8, s.start(8, now)) // the test of the cut
	for c.Lo < c.Hi {
		top := c.Limit(now)
		var id uint64
		for n := c.Lo + 1; n <= top; n++ {
			id = s.start(n, now)
		}
		s.admitted(top, id)
		now += sec
	}
	if c.Lo != 16 || c.Step < 2 {
		t.Fatalf("after the climb to the ceiling: %+v", c)
	}
	return s, now
}

// A refusal reported far later than any refusal takes (its client
// stalled) counts as the longest gap, and a few ordinary refusals bring
// the gap back.
func TestGapAfterAVeryLateRefusal(t *testing.T) {
	c := New(1, 64, 4, 10*time.Second)
	now := int64(0)
	refuse := func(d time.Duration) { timeRefusals(c, &now, d) }
	for range 10 {
		refuse(50 * time.Millisecond)
	}
	refuse(time.Hour)
	if c.Gap() != maxGap {
		t.Fatalf("gap %v after a refusal an hour late: want %v", c.Gap(), maxGap)
	}
	n := 0
	for c.Gap() > 150*time.Millisecond {
		refuse(50 * time.Millisecond)
		n++
	}
	if n > 20 {
		t.Fatalf("%d refusals of 50 ms to bring the gap under 150 ms after one an hour late", n)
	}
	t.Logf("%d refusals of 50 ms brought the gap under 150 ms", n)
}

// batchOut has a batch of four probes out, 17 to 20 over a Lo of 16, with
// no ceiling known (as a climb that has widened its batches leaves it), and
// returns the time they went.
func batchOut(t *testing.T) (*starts, int64) {
	t.Helper()
	s := &starts{c: New(1, 64, 16, 10*time.Second)}
	c := s.c
	c.Step = maxStep
	now := sec
	if got := c.Limit(now); got != 20 {
		t.Fatalf("limit %d, want a batch up to 20: %+v", got, c)
	}
	for n := 17; n <= 20; n++ {
		s.start(n, now)
	}
	return s, now
}

// The ceiling a batch of probes finds is its top less its refusals,
// whichever of its starts were refused: here the cap is 18, and the
// upstream refuses the starts at 17 and 20, as they reached it in another
// order than the counts they started with. The ceiling is 18, and probes
// go again from 16 to it after a Gap (when only the first refusal counted,
// the ceiling was 16 until a retest 10 s later).
func TestBatchRefusalsSetTheCeilingInAnyOrder(t *testing.T) {
	s, now := batchOut(t)
	c := s.c
	ids := map[int]uint64{17: s.seq - 3, 18: s.seq - 2, 19: s.seq - 1, 20: s.seq}
	ans := now + int64(50*time.Millisecond)
	c.Refused(17, ids[17], now, ans, s.seq)
	c.Refused(20, ids[20], now, ans, s.seq)
	s.admitted(18, ids[18])
	s.admitted(19, ids[19])
	if c.Hi != 18 || c.Lo != 16 {
		t.Fatalf("after refusals at 17 and 20 of a batch up to 20: %+v, want the ceiling 18 over 16", c)
	}
	if got := c.Limit(ans); got != 16 {
		t.Fatalf("limit %d while the batch's refusals come in: want 16, no probe", got)
	}
	if got := c.WakeAt(ans); got != c.BatchUntil {
		t.Fatalf("wake at %d, want the end of the batch's Gap %d", got, c.BatchUntil)
	}
	if got := c.Limit(c.BatchUntil); got != 17 {
		t.Fatalf("limit %d after the Gap: want 17, a probe toward the ceiling", got)
	}
}

// Refusals of a batch's top starts that arrive highest first take the
// ceiling to the count under the lowest refused, not one over the cap (when
// only the first refusal counted, the ceiling stayed at 19 over a cap of 18
// until a refusal within it cut the cap).
func TestBatchRefusalsHighestFirst(t *testing.T) {
	s, now := batchOut(t)
	c := s.c
	ans := now + int64(50*time.Millisecond)
	c.Refused(20, s.seq, now, ans, s.seq)
	c.Refused(19, s.seq-1, now, ans, s.seq)
	if c.Hi != 18 || c.Lo != 18 {
		t.Fatalf("after refusals at 20, then 19: %+v, want the cap and ceiling 18", c)
	}
	// Refusals of other starts of the batch's counts, made after the first
	// refusal, are not the batch's: a start at 18 now is within Lo, and its
	// refusal is a cut.
	id := s.start(18, ans)
	c.Refused(18, id, ans, ans+int64(50*time.Millisecond), s.seq)
	if c.Streak != 1 || c.BatchTop != 0 {
		t.Fatalf("a refusal within the cap after the batch's: %+v, want a cut", c)
	}
}

// The count of a refused batch's refusals, at its edges.
func TestBatchCountEdges(t *testing.T) {
	ms := int64(time.Millisecond)
	// refused has the batch up to 20 refused at 20 (the cap is 18): the
	// ceiling is 19 until more of its refusals come in.
	refused := func(t *testing.T) (*starts, int64) {
		s, now := batchOut(t)
		s.c.Refused(20, s.seq, now, now+50*ms, s.seq)
		if s.c.Hi != 19 || s.c.BatchN != 1 {
			t.Fatalf("after the refusal at 20: %+v", s.c)
		}
		return s, now + 50*ms
	}
	t.Run("a refusal applied twice counts once", func(t *testing.T) {
		s, now := refused(t)
		c := s.c
		c.Refused(20, s.seq, now-50*ms, now, s.seq)
		c.Refused(19, s.seq-1, now-50*ms, now, s.seq)
		c.Refused(19, s.seq-1, now-50*ms, now, s.seq)
		if c.Hi != 18 {
			t.Fatalf("refusals at 20 and 19, each applied twice: %+v, want the ceiling 18", c)
		}
	})
	t.Run("a refusal of an older batch does not count", func(t *testing.T) {
		s, now := refused(t)
		c := s.c
		c.Refused(19, c.BatchAfter, now-500*ms, now, s.seq)
		if c.Hi != 19 {
			t.Fatalf("a refusal of a start before the batch: %+v, want the ceiling 19", c)
		}
	})
	t.Run("the retest waits for the count too", func(t *testing.T) {
		s, now := refused(t)
		c := s.c
		c.Retest = time.Millisecond // shorter than the count's Gap
		c.Refused(19, s.seq-1, now-50*ms, now, s.seq)
		c.Refused(18, s.seq-2, now-50*ms, now, s.seq)
		c.Refused(17, s.seq-3, now-50*ms, now, s.seq)
		if c.Lo != 16 || c.Hi != 16 {
			t.Fatalf("every probe of the batch refused: %+v, want 16", c)
		}
		if got := c.WakeAt(now); got != c.BatchUntil {
			t.Fatalf("wake at %d, want the end of the count %d", got, c.BatchUntil)
		}
		if got := c.Limit(c.BatchUntil); got != 17 {
			t.Fatalf("limit %d after the count, want the retest at 17", got)
		}
	})
	t.Run("a clock stepped back does not hold probes", func(t *testing.T) {
		// The lowest probe refused: probes climb from 16 to the ceiling
		// of 19 once the count is over, or at once by a clock that has
		// stepped back since.
		s, now := batchOut(t)
		c := s.c
		c.Refused(17, s.seq-3, now, now+50*ms, s.seq)
		if c.Lo != 16 || c.Hi != 19 {
			t.Fatalf("after the refusal at 17: %+v", c)
		}
		if got := c.Limit(now + 50*ms); got != 16 {
			t.Fatalf("limit %d while the count is on, want 16", got)
		}
		back := now - 10*sec
		if got := c.Limit(back); got != 17 {
			t.Fatalf("limit %d with the clock 10 s back, want a probe at 17 (%+v)", got, c)
		}
		if got := c.WakeAt(back); got != 0 {
			t.Fatalf("wake at %d with the clock 10 s back, want 0", got)
		}
	})
	t.Run("a start over Lo meanwhile is no new batch", func(t *testing.T) {
		// Another process of a fleet starts at 20 under the limit it had;
		// the batch's refusal at 19 still counts, and that start's refusal
		// does not raise the ceiling.
		s, now := refused(t)
		c := s.c
		late := s.start(20, now)
		c.Refused(19, s.seq-2, now-50*ms, now, s.seq)
		c.Refused(20, late, now, now+50*ms, s.seq)
		if c.Hi != 18 || c.Lo > c.Hi {
			t.Fatalf("after the batch's refusal at 19 and a later start's at 20: %+v, want the ceiling 18", c)
		}
	})
	t.Run("an overload ends the count", func(t *testing.T) {
		s, now := refused(t)
		c := s.c
		batch := s.seq
		c.Overloaded(s.start(10, now), s.seq)
		c.Refused(19, batch-1, now-50*ms, now, s.seq)
		if c.BatchTop != 0 || c.Hi != 19 {
			t.Fatalf("a refusal of the batch after an overload: %+v", c)
		}
	})
	t.Run("refusals of starts made after the count began are not the batch's", func(t *testing.T) {
		// Another process, under the limit it had, starts at 19 and 20
		// after the batch's refusals at 20 and 19: their refusals leave
		// the ceiling at 18.
		s, now := refused(t)
		c := s.c
		c.Refused(19, s.seq-1, now-50*ms, now, s.seq)
		late19, late20 := s.start(19, now), s.start(20, now)
		c.Refused(19, late19, now, now+50*ms, s.seq)
		c.Refused(20, late20, now, now+50*ms, s.seq)
		if c.Hi != 18 || c.Lo != 18 {
			t.Fatalf("after refusals of later starts at 19 and 20: %+v, want the cap and ceiling 18", c)
		}
	})
	t.Run("an admission over the ceiling ends the count", func(t *testing.T) {
		s, now := refused(t)
		c := s.c
		batch, hi := s.seq, c.Hi
		s.admitted(20, s.start(20, now))
		c.Refused(19, batch-1, now-50*ms, now, s.seq)
		if c.Lo != hi || c.Hi != c.Ceil {
			t.Fatalf("a refusal of the batch after a later start at 20 was admitted: %+v, want the cap at the old ceiling %d and no ceiling", c, hi)
		}
	})
	t.Run("a count set by a clock since stepped back ends at the next start", func(t *testing.T) {
		// After the lowest probe's refusal, probes are held until the
		// count's end; with the clock 10 s back, a start drops that end,
		// and probes may go as the clock comes back toward it.
		s, now := batchOut(t)
		c := s.c
		c.Refused(17, s.seq-3, now, now+50*ms, s.seq)
		back := now - 10*sec
		s.start(16, back)
		if c.BatchUntil != 0 {
			t.Fatalf("a start with the clock 10 s back: %+v, want the count's end dropped", c)
		}
		if !c.MayProbe(back + 9*sec + 990*ms) {
			t.Fatalf("probes held with the clock back and coming back: %+v", c)
		}
	})
	t.Run("the ceiling stays under a lowered Ceil", func(t *testing.T) {
		s, now := refused(t)
		c := s.c
		c.Configure(1, 10, c.Retest)
		c.Refused(18, s.seq-2, now-50*ms, now, s.seq)
		if c.Hi > 10 || c.Lo > c.Hi {
			t.Fatalf("a refusal of the batch under a Ceil of 10: %+v", c)
		}
	})
}

// A refusal over Lo while a cut is being tested (of a start another
// process made under the limit it had) lowers the ceiling, and leaves the
// cut and its test; a refusal within Lo then cuts further, whatever start
// is the test.
func TestRefusalOverACut(t *testing.T) {
	s, now := cutThrice(t)
	c := s.c
	test := s.start(8, now)
	s.refuse(12, now)
	if c.Lo != 8 || c.Hi != 11 || c.Streak != 3 || c.ProbeN != 8 {
		t.Fatalf("after a refusal at 12 during the cut's test: %+v, want the ceiling 11 and the test out", c)
	}
	s.admitted(8, test)
	if c.Streak != 0 || c.Lo != 8 {
		t.Fatalf("the cut's test admitted: %+v, want the cut over", c)
	}

	// Cut again; another process's start at 17 is the test, and a
	// refusal within Lo meanwhile cuts further.
	for _, m := range []int{8, 7} {
		s.refuse(m, now)
	}
	lo, streak := c.Lo, c.Streak
	s.start(17, now)
	if c.ProbeN != 17 || streak != 2 {
		t.Fatalf("a start at 17 after a second refusal: %+v, want it the cut's test", c)
	}
	s.refuse(lo, now)
	if c.Streak != streak+1 || c.Lo >= lo {
		t.Fatalf("a refusal within Lo while a start over it is the cut's test: %+v, want a further cut from %d", c, lo)
	}
}

// Before any refusal is timed the gap is its initial one; a refusal of no
// time at all (on a virtual clock) counts as timed, at the shortest gap,
// and is not taken for none by the refusals after it.
func TestGapAfterARefusalOfNoTime(t *testing.T) {
	c := New(1, 64, 4, 10*time.Second)
	if c.Gap() != initialGap {
		t.Fatalf("gap %v before any refusal: want %v", c.Gap(), initialGap)
	}
	now := int64(0)
	timeRefusals(c, &now, 0)
	if c.Refusal == 0 || c.Gap() != minGap {
		t.Fatalf("after a refusal of no time: refusal %v, gap %v; want one timed, gap %v", c.Refusal, c.Gap(), minGap)
	}
	timeRefusals(c, &now, 400*time.Millisecond)
	if want := 100 * time.Millisecond; c.Refusal != want {
		t.Fatalf("refusal %v after one of no time and one of 400 ms: want the average %v", c.Refusal, want)
	}
}

// A ceiling a refusal found, which a bound lowered to it meets, is still
// found when the bound is raised again: it holds until its retest. The
// bound's Hi == Ceil ("unknown") must not take it for none found.
func TestFoundCeilingAtALoweredBoundSurvivesItsRaise(t *testing.T) {
	c := New(1, 20, 8, time.Hour)
	now := int64(time.Second)
	c.Refused(9, 1, now, now, 1) // the upstream's cap is 8
	if c.Hi != 8 || c.Lo != 8 {
		t.Fatalf("after the refusal at 9: Lo %d Hi %d, want 8 and 8", c.Lo, c.Hi)
	}
	c.Configure(1, 8, time.Hour)  // the bound lowered to the cap found
	c.Configure(1, 20, time.Hour) // and raised back, a minute later
	if got := c.Limit(now + int64(time.Minute)); got != 8 || c.Hi != 8 {
		t.Fatalf("limit %d, Hi %d: the ceiling found a minute ago is forgotten, probes go over it", got, c.Hi)
	}
}

// A ceiling found at the very start of its clock (now 0, as a Gate's
// clock reads when it was just made) is found all the same: raised, the
// bound does not take it for none found.
func TestCeilingFoundAtTheClocksStart(t *testing.T) {
	c := New(1, 8, 8, time.Hour)
	c.Refused(9, 1, 0, 0, 1) // the bound is the upstream's cap, found at 0
	if c.Hi != 8 || c.HiAt == 0 {
		t.Fatalf("after the refusal at 9: Hi %d HiAt %d, want 8 and a time", c.Hi, c.HiAt)
	}
	c.Configure(1, 20, time.Hour)
	if got := c.Limit(int64(time.Minute)); got != 8 || c.Hi != 8 {
		t.Fatalf("limit %d, Hi %d: the ceiling found at 0 is forgotten", got, c.Hi)
	}
}

// A batch of probes ends a Gap after its highest start, however many starts
// at that count follow it (under steady load, a slot freed and another
// taken): they put off its end for as long as the load lasted. A refusal of
// one of them that comes after the end is one of a count within the cap,
// as after an admission: a step down, and the cut's test.
func TestBatchEndsAGapAfterItsHighestStart(t *testing.T) {
	ms := int64(time.Millisecond)
	c := New(1, 16, 4, time.Minute)
	for n := 1; n <= 5; n++ {
		c.Started(n, 0) // the fifth is the batch's one probe
	}
	c.Started(5, 400*ms) // start 6: one of the five ended, and it took its place
	c.Tick(500*ms, 6)
	if c.ProbeN != 0 || c.Lo != 5 {
		t.Fatalf("a Gap after the probe, the batch is still out: %+v", c)
	}
	c.Refused(5, 6, 400*ms, 700*ms, 6)
	if c.Lo != 4 || c.Hi != 4 || c.Streak != 1 {
		t.Fatalf("a refusal within the cap after the batch ended: want cap 4, ceiling 4, one refusal: %+v", c)
	}
}

// A batch's time set by a clock that has since stepped back (by more than
// maxGap) is dropped at the next start at its count, as a count's end is
// (ahead): otherwise a batch whose slots are never reported stays out
// until the clock comes back to it, and the cap does not climb meanwhile.
// (Before a batch ended a Gap after its highest start, every start at its
// count moved its time, which mended it.)
func TestBatchTimeSetByAClockSinceSteppedBack(t *testing.T) {
	sec := int64(time.Second)
	c := New(1, 16, 4, time.Minute)
	for n := 1; n <= 5; n++ {
		c.Started(n, 100*sec) // the fifth is the batch's one probe
	}
	back := 40 * sec // the clock steps back a minute
	c.Started(5, back)
	c.Tick(back+sec, 6)
	if c.ProbeN != 0 || c.Lo != 5 {
		t.Fatalf("a Gap after a start at the batch's count with the clock a minute back, the batch is still out (until %d): %+v", c.WakeAt(back+sec), c)
	}
}
