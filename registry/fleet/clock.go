package fleet

import (
	"math"
	"sync"
	"time"
)

// A call that fails on the client's side (a timeout) may still run on the
// server, however late: its bytes wait in a stalled server's socket, or in
// the network. So that such a late call cannot add a lease nobody holds,
// every call that may add one carries a deadline on the server's clock,
// its not-after time, past which the script refuses to run it (and changes
// nothing). The client does not know the server's clock; it estimates it
// from the server times that replies carry, and it gives each call twice
// the call timeout (a call queued for a pipeline may take that long). The
// removal of what a failed call may add (an abandon) is then given up only
// once the server's clock has certainly passed the call's not-after time.

// unknownUntil stands for a not-after time not known: a call made before
// any reply told the server's clock runs unbounded, and the removal of what
// it may add is never given up.
const unknownUntil = math.MaxInt64

// serverClock estimates the store's clock (what TIME returns in the
// scripts), in milliseconds, from replies that carry it. The zero value
// knows nothing, and its local readings count from the zero time.
type serverClock struct {
	base time.Time // the origin of local readings, with a monotonic one

	mu    sync.Mutex // protects the fields below
	known bool
	// low and high bound the server's clock minus the local one: the
	// server read its clock somewhere between a call's sending and its
	// reply.
	low, high int64
	// near and far bound it as every reply since the last jump does: the
	// intersection of their bounds, which replies that came back at once
	// narrow to a millisecond or two however slow the others were (see
	// nanos).
	near, far int64
	seenAt    int64 // the local reading at the latest reply
	farAt     int64 // the local reading at the reply that gave far
}

// local returns the local clock's reading, in milliseconds since c.base.
func (c *serverClock) local() int64 { return time.Since(c.base).Milliseconds() }

// seen records a reply with the server time now, to a call sent at the
// local reading sent and answered at back. The latest reply is the one
// kept: a server clock that jumped is followed from its next reply.
func (c *serverClock) seen(now, sent, back int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	low, high := now-back, now-sent
	// The readings are whole milliseconds, each rounded down: the offset
	// itself is within a millisecond more on either side, which near and
	// far keep, so that rounding does not make two replies disagree.
	wl, wh := low-1, high+1
	if c.known && max(c.near, wl) <= min(c.far, wh) {
		if wh < c.far {
			c.farAt = back
		}
		c.near, c.far = max(c.near, wl), min(c.far, wh)
	} else { // the first reply, or the clocks have moved apart
		c.near, c.far, c.farAt = wl, wh, back
	}
	c.known, c.low, c.high, c.seenAt = true, low, high, back
}

// notAfter returns the not-after time of a call made now that may last
// span: the latest server time it may still be running at, estimated
// generously; unknownUntil if the server's clock is not known yet.
func (c *serverClock) notAfter(span time.Duration) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.known {
		return unknownUntil
	}
	return c.local() + c.high + span.Milliseconds()
}

// past reports whether the server's clock has certainly passed t.
func (c *serverClock) past(t int64) bool {
	if t == unknownUntil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.known && c.local()+c.low > t
}

// scriptUntil is t as the scripts take it: 0 for no bound.
func scriptUntil(t int64) int64 {
	if t == unknownUntil {
		return 0
	}
	return t
}

// nanos returns the server's clock now as best estimated, in nanoseconds:
// the local clock's while no reply has told it. A learned cap compares
// times from several processes with it, some within tens of milliseconds,
// so it reads the narrowest bounds, not the latest reply's, which a busy
// process may have read late.
func (c *serverClock) nanos() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.known {
		return time.Now().UnixNano()
	}
	return (c.local() + (c.near+c.far)/2) * int64(time.Millisecond)
}

// startCeiling returns a number no start admitted by now can have been
// given (see learn.go): the server's clock now, in microseconds, estimated
// generously.
func (c *serverClock) startCeiling() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.known {
		return uint64(time.Now().UnixMicro())
	}
	// The latest reply's high is of readings rounded down: 2 ms over (far
	// has its millisecond already, and one more does no harm); and the
	// clocks may drift apart since a reply: 1 ms a 10 s more.
	now := c.local()
	latest := c.high + max(now-c.seenAt, 0)/10_000
	narrow := c.far + max(now-c.farAt, 0)/10_000
	return uint64(now+min(latest, narrow)+2) * 1000
}

// told reports whether a reply has told the server's clock.
func (c *serverClock) told() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.known
}
