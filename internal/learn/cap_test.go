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
