package core

import (
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
	"weak"
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
	site    []uintptr // where it was acquired, when recorded (recordSite)
	// standIn is the stand-in Hold, the one Release must come through. A
	// strong pointer would keep the Slot alive, and its cleanup would never
	// run.
	standIn weak.Pointer[Hold]
	// First, if set, is called first by a reclaim, on the runtime's
	// cleanup goroutine, so it must be quick (a Transport's cancel of the
	// exchange of a response dropped with its Slot). It is given the rest
	// of the reclaim, which frees the hold: it must call it once, at once
	// or later (a Transport's linger), also if it panics.
	First atomic.Pointer[func(rest func())]
}

// A Leaker reclaims a Tracked hold whose Slot was dropped: it reads what it
// will report (the key) while the hold is still counted, frees the hold with
// ReleaseQuietly, and reports the leak. Owners without it are freed silently.
type Leaker interface {
	Reclaim(t *Tracked)
}

// modulePrefix marks this module's frames, which a site report skips.
const modulePrefix = "github.com/inflight-go/inflight/"

// recordSite records the caller's stack, skipping skip frames above
// recordSite's caller, for callSite. It costs about a microsecond.
func (t *Tracked) recordSite(skip int) {
	var pcs [16]uintptr
	n := runtime.Callers(skip+2, pcs[:])
	t.site = append([]uintptr(nil), pcs[:n]...)
}

// callSite describes where the hold was acquired: the first frames outside this
// module, innermost first, as "function (file:line)"; "" when no site was
// recorded.
func (t *Tracked) callSite() string {
	if len(t.site) == 0 {
		return ""
	}
	var out []string
	frames := runtime.CallersFrames(t.site)
	for {
		f, more := frames.Next()
		// The last element of its package's path, from a name such as
		// "github.com/x/y.(*T).M.func1": y.
		pkg, _, _ := strings.Cut(f.Function[strings.LastIndex(f.Function, "/")+1:], ".")
		if !strings.HasPrefix(f.Function, modulePrefix) || strings.HasSuffix(pkg, "_test") {
			out = append(out, fmt.Sprintf("%s (%s:%d)", f.Function, f.File, f.Line))
		}
		if !more || len(out) == 3 {
			break
		}
	}
	return strings.Join(out, " <- ")
}

// AttachTo makes stand-in (the Hold inside the user's Slot, which must be
// reachable as slot) stand for t, once t has been admitted, and arranges for
// t to be reclaimed if slot is dropped while held.
func AttachTo[S any](t *Tracked, slot *S, standIn *Hold) {
	standIn.Owner = t
	standIn.ID, standIn.At, standIn.Bypassed, standIn.Extra = t.ID, t.At, t.Bypassed, t.Extra
	t.standIn = weak.Make(standIn)
	// The cleanup's argument is t, which does not reach slot: the lane
	// refers to t, never to the Slot.
	t.cleanup = runtime.AddCleanup(slot, reclaim, t)
}

// reclaim runs when a Slot was dropped without Release: it frees the hold.
// It runs on a runtime goroutine, outside any testing/synctest bubble.
func reclaim(t *Tracked) {
	defer Recovered("a dropped slot's reclaim", &t.Hold)
	if f := t.First.Swap(nil); f != nil {
		(*f)(func() { reclaim(t) })
		return
	}
	if l, ok := t.Hold.Owner.(Leaker); ok && !t.Hold.Bypassed {
		l.Reclaim(t)
		return
	}
	t.Hold.ReleaseQuietly() // a bypassed hold holds no capacity: nothing to report
}

// Recovered, deferred on a goroutine of the library's own (a timer's, a
// cleanup's), logs a panic there to the logger of h's owner (h is the
// hold of an admission) instead of ending the process: one in the user's
// code that what calls (an Observer told of a release, a body's Close, a
// logger), after the slot is freed (a cut exchange's, by a reclaim's
// First, after its linger). A logger that panics again is not told.
func Recovered(what string, h *Hold) {
	if p := recover(); p != nil {
		defer func() { _ = recover() }()
		h.Owner.Log().Error("inflight: a panic on "+what+" was recovered; the slot is freed (a cut exchange's once its linger ends)", slog.Any("panic", p))
	}
}

// Release implements Owner for the stand-in: it frees the tracked hold. A
// copy of the Slot (which go vet flags) is another Hold: refused as misuse.
func (t *Tracked) Release(h *Hold) bool {
	if t.standIn.Value() != h {
		t.Hold.Owner.Misuse(&t.Hold)
		return false
	}
	t.cleanup.Stop()
	return t.Hold.Release()
}

// Misuse implements Owner for the stand-in.
func (t *Tracked) Misuse(*Hold) { t.Hold.Owner.Misuse(&t.Hold) }

// Time implements Owner for the stand-in.
func (t *Tracked) Time(at int64) time.Time { return t.Hold.Owner.Time(at) }

// Log implements Owner for the stand-in.
func (t *Tracked) Log() *slog.Logger { return t.Hold.Owner.Log() }
