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
		"no gap":     func(c *Cap) { c.Gap = 0 },
		"no step":    func(c *Cap) { c.Step = 0 },
		"cap 0":      func(c *Cap) { c.Lo = 0 },
		"streak < 0": func(c *Cap) { c.Streak = -1 },
	} {
		c := New(1, 64, 4, 10*time.Second)
		bad(c)
		if c.Valid() {
			t.Errorf("%s: valid: %+v", name, c)
		}
	}
}

// A batch of probes that no refusal answers within Gap counts as admitted;
// but a check of its silence that comes late (the client's process was
// paused, or its machine busy) may have the refusal waiting unread behind
// it, and counts the Gap again from then.
func TestSilenceCountsWhileListening(t *testing.T) {
	const ms = int64(time.Millisecond)
	probe := func() *Cap {
		c := New(1, 64, 4, 10*time.Second)
		c.Gap = 100 * time.Millisecond
		if got := c.Limit(0); got != 5 {
			t.Fatalf("limit before the probe: %d, want 5", got)
		}
		c.Started(5, 1000*ms)
		return c
	}

	t.Run("on time", func(t *testing.T) {
		c := probe()
		if at := c.WakeAt(1000 * ms); at != 1100*ms {
			t.Fatalf("WakeAt: %d ms, want 1100", at/ms)
		}
		c.Tick(1099 * ms)
		if c.Lo != 4 {
			t.Fatalf("within the gap: Lo %d, want 4", c.Lo)
		}
		c.Tick(1150 * ms) // half a gap late at most: on time
		if c.Lo != 5 || c.ProbeN != 0 {
			t.Fatalf("after the gap: Lo %d, ProbeN %d; want 5, 0", c.Lo, c.ProbeN)
		}
	})

	t.Run("late", func(t *testing.T) {
		c := probe()
		c.Tick(1151 * ms) // more than half a gap late
		if c.Lo != 4 || c.ProbeN != 5 {
			t.Fatalf("a late check: Lo %d, ProbeN %d; want 4, 5", c.Lo, c.ProbeN)
		}
		if at := c.WakeAt(1151 * ms); at != 1251*ms {
			t.Fatalf("WakeAt after a late check: %d ms, want 1251", at/ms)
		}
		if got := c.Limit(1151 * ms); got != 5 {
			t.Fatalf("the batch is still out: limit %d, want 5", got)
		}
		// The refusal that waited unread: a probe refused, the cap kept.
		c.Refused(5, 1, 1000*ms, 1160*ms, 2)
		if c.Lo != 4 || c.Hi != 4 {
			t.Fatalf("the probe's refusal: Lo %d, Hi %d; want 4, 4", c.Lo, c.Hi)
		}
	})

	t.Run("late, then silence", func(t *testing.T) {
		c := probe()
		c.Tick(1400 * ms)
		c.Tick(1499 * ms)
		if c.Lo != 4 {
			t.Fatalf("within the gap counted again: Lo %d, want 4", c.Lo)
		}
		c.Tick(1500 * ms)
		if c.Lo != 5 {
			t.Fatalf("a gap of silence while listening: Lo %d, want 5", c.Lo)
		}
	})
}
