package core

import (
	"log/slog"
	"runtime"
	"slices"
	"time"
)

// Combine returns a Handle holding those of parts that hold something (nil
// if none does): Bypassed or Degraded if one of them is, acquired when the
// last was. Released, it releases each part once, quietly, and then calls
// done, if not nil, on the releasing goroutine (a panic there, or in a
// part's release, goes on after every part is freed and done is called).
// Releasing a part itself does not call done.
func Combine(done func(), parts ...*Handle) *Handle {
	held := slices.DeleteFunc(slices.Clone(parts), func(p *Handle) bool { return p == nil || p.h.Owner == nil })
	if len(held) == 0 {
		return nil
	}
	x := new(Handle)
	c := &combined{parts: held, hold: &x.h, done: done}
	x.h.Owner = c
	for _, p := range held {
		x.h.Bypassed = x.h.Bypassed || p.h.Bypassed
		x.h.Degraded = x.h.Degraded || p.h.Degraded
		x.h.Extra = max(x.h.Extra, p.h.Extra) // its Units: the largest part's
		if at := p.h.Owner.Time(p.h.At); at.After(c.at) {
			c.at = at
		}
	}
	x.h.ID = held[0].h.ID
	return x
}

// combined is the Owner of a Combine handle's hold (hold: a copy of the
// handle frees nothing).
type combined struct {
	parts []*Handle
	hold  *Hold
	at    time.Time
	done  func()
}

// Release implements Owner.
func (c *combined) Release(h *Hold) bool {
	if h != c.hold {
		return false // a copy: it releases nothing
	}
	if c.done != nil {
		defer c.done()
	}
	c.releaseFrom(0)
	return true
}

// releaseFrom releases parts[i:], each once: a panic in one's release (an
// Observer's, told of it) goes on once the rest are released.
func (c *combined) releaseFrom(i int) {
	if i < len(c.parts) {
		defer c.releaseFrom(i + 1)
		c.parts[i].h.ReleaseQuietly()
		runtime.KeepAlive(c.parts[i]) // with leak detection, see slots.Slot.Release
	}
}

// Parts returns the handles combined (for their kind: slots' Transport).
func (c *combined) Parts() []*Handle { return c.parts }

// Misuse implements Owner: a second release frees nothing more.
func (c *combined) Misuse(*Hold) {}

// Time implements Owner.
func (c *combined) Time(int64) time.Time { return c.at }

// Log implements Owner: the first part's logger.
func (c *combined) Log() *slog.Logger { return c.parts[0].h.Owner.Log() }
