package slots

import (
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// Combine holds the non-nil parts in one Slot, Bypassed or Degraded if one is.
func Combine(parts ...*Slot) *Slot {
	var held []*Slot
	for _, p := range parts {
		if p.holds() {
			held = append(held, p)
		}
	}
	if len(held) == 0 {
		return nil
	}
	s := new(Slot)
	h := s.hold()
	c := &combined{parts: held, hold: h}
	h.Owner = c
	for _, p := range held {
		h.Bypassed = h.Bypassed || p.hold().Bypassed
		h.Degraded = h.Degraded || p.hold().Degraded
		if at := p.AcquiredAt(); at.After(c.at) {
			c.at = at
		}
	}
	h.ID = held[0].ID()
	return s
}

// combined is the Owner of a Combine slot's hold.
type combined struct {
	parts []*Slot
	hold  *core.Hold // the combined Slot's own: a copy of it frees nothing
	at    time.Time
}

// Release implements core.Owner.
func (c *combined) Release(h *core.Hold) bool {
	if h != c.hold {
		c.Misuse(h)
		return false
	}
	for _, p := range c.parts {
		p.releaseQuietly()
	}
	return true
}

// Misuse implements core.Owner: the combined slot was released twice, or a
// copy of it was released; that releases nothing more.
func (c *combined) Misuse(*core.Hold) {}

// Time implements core.Owner.
func (c *combined) Time(int64) time.Time { return c.at }
