package core

import (
	"runtime"
	"time"
)

// Tracked keeps the hold that a lane counts apart from the user's Slot, for
// leak detection. Normally the Slot is the hold, and the lane's reference to
// it keeps the Slot reachable for as long as it is held; with a Tracked, the
// lane refers to the Tracked only, the Slot is a stand-in whose Owner is the
// Tracked, and a Slot dropped while held can become unreachable. A cleanup
// attached to the Slot (AttachTo) then frees the hold and reports the leak.
type Tracked struct {
	Hold    // what the lane counts; its Owner is the lane
	cleanup runtime.Cleanup
}

// A Leaker is told when a Tracked hold is reclaimed from a dropped Slot,
// after its capacity has been freed. Owners implement it optionally.
type Leaker interface {
	Leaked(h *Hold)
}

// AttachTo makes stand-in (the Hold inside the user's Slot, which must be
// reachable as slot) stand for t, once t has been admitted, and arranges for
// t to be reclaimed if slot is dropped while held.
func AttachTo[S any](t *Tracked, slot *S, standIn *Hold) {
	standIn.Owner = t
	standIn.ID, standIn.At, standIn.Bypassed = t.ID, t.At, t.Bypassed
	// The cleanup's argument is t, which does not reach slot: the lane
	// refers to t, never to the Slot.
	t.cleanup = runtime.AddCleanup(slot, reclaim, t)
}

// reclaim runs when a Slot was dropped without Release: it frees the hold.
func reclaim(t *Tracked) {
	if !t.Hold.ReleaseQuietly() || t.Hold.Bypassed {
		return
	}
	if l, ok := t.Hold.Owner.(Leaker); ok {
		l.Leaked(&t.Hold)
	}
}

// Release implements Owner for the stand-in: it frees the tracked hold.
func (t *Tracked) Release(*Hold) {
	t.cleanup.Stop()
	t.Hold.Release()
	runtime.KeepAlive(t)
}

// Misuse implements Owner for the stand-in.
func (t *Tracked) Misuse(*Hold) { t.Hold.Owner.Misuse(&t.Hold) }

// Time implements Owner for the stand-in.
func (t *Tracked) Time(at int64) time.Time { return t.Hold.Owner.Time(at) }
