package core

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// An Owner frees the capacity a Hold took. Methods may be called from any
// goroutine, without the owner's lock held.
type Owner interface {
	// Release frees h's capacity and reports whether it did. It is called
	// at most once per Hold; it reports false (and reports the misuse to
	// Misuse) for a copy of a Slot, which is another Hold that holds nothing.
	Release(h *Hold) bool
	// Misuse counts a Release call on a Hold that was already released.
	Misuse(h *Hold)
	// Time converts an acquire time (owner clock nanoseconds) to a time.Time.
	Time(at int64) time.Time
	// Log returns the logger of warnings about its holds (WithLogger).
	Log() *slog.Logger
}

// Hold is the record of one admission: the holder that a lane counts.
// It is the whole of the user's *slots.Slot, so admission allocates once;
// it is kept small and nearly pointer-free (48 bytes, one interface) because
// its allocation and the GC work after it are most of an admission's cost.
type Hold struct {
	released atomic.Bool
	// Idx is the hold's place in its lane's HolderSet; a multi-lane hold
	// keeps its places in its owner's record instead. Guarded by the owner's
	// lock.
	Idx int32

	// Owner frees the capacity: the lane the hold was admitted in, or a
	// record of its lanes.
	Owner Owner
	ID    uint64
	At    int64 // acquire (grant) time, owner clock nanoseconds
	// Extra is the units the hold takes beyond one (see Units): 0 for an
	// admission that counts one request, so that every Hold made without
	// a weight weighs one. Placed before the flags below, which fill the
	// rest of its 8 bytes.
	Extra    int32
	Bypassed bool  // admitted by fail-open; holds no capacity
	Degraded bool  // admitted without its fleet-wide cap (its store was unreachable)
	Class    uint8 // priority class: ClassDefault for a fast admission without shares
	// GivenBack marks a grant returned because its caller's context ended
	// as it came: the owner frees it like any other but reports no release.
	GivenBack bool
}

// MaxUnits is the largest weight an admission may take.
const MaxUnits = 1<<31 - 1

// The reasons of package slots that the engine tells apart (see there).
var (
	ErrBadUnits     = errors.New("slots: units out of range")
	ErrExceedsLimit = errors.New("slots: weight exceeds the limit")
	ErrWaitTimeout  = errors.New("slots: wait timeout")
	ErrNilContext   = errors.New("slots: nil context")
	ErrInvalidKey   = errors.New("registry: invalid key") // of package registry, whose keys come from requests
)

// CheckUnits returns an error wrapping ErrBadUnits for a weight n outside
// 1..MaxUnits, or nil; for every owner that takes weights.
func CheckUnits(n int) error {
	if n < 1 || n > MaxUnits {
		return fmt.Errorf("%w: %d (want 1 to %d)", ErrBadUnits, n, MaxUnits)
	}
	return nil
}

// TopFlows is how many flows a queue's report names (slots.QueueStats).
const TopFlows = 10

// Units returns the units of capacity the hold takes.
func (h *Hold) Units() int { return int(h.Extra) + 1 }

// Release frees the hold's capacity once and reports whether this call did.
func (h *Hold) Release() bool {
	if !h.released.CompareAndSwap(false, true) {
		h.Owner.Misuse(h)
		return false
	}
	return h.Owner.Release(h)
}

// Released reports whether Release has been called.
func (h *Hold) Released() bool { return h.released.Load() }

// ReleaseQuietly is Release for the seams that may see several ends of one
// use (a body's EOF, then its Close, then its context's end): a call after
// the first is expected there, not misuse, and is not counted.
func (h *Hold) ReleaseQuietly() bool {
	return h.released.CompareAndSwap(false, true) && h.Owner.Release(h)
}

// bypassed is the Owner of a fail-open hold (Engine.bypass): it holds no
// capacity, so its release frees nothing, but a copy of its Slot must
// still be told from it. It is a small record of the hold (fail-open is
// the rare path, so the allocation is paid only there).
type bypassed struct {
	Owner // the hold's own: counts misuse and converts times
	hold  *Hold
}

func (b *bypassed) Release(h *Hold) bool {
	if h != b.hold {
		b.Misuse(h)
		return false
	}
	return true
}

// Handle is the record behind a user's *slots.Slot, which package slots
// declares as a Handle (type Slot core.Handle): every package of the module
// can make a Slot with new(core.Handle) and a conversion, and reach its hold
// through Hold, while users can reach neither.
type Handle struct{ h Hold }

// Hold returns the hold inside x.
func (x *Handle) Hold() *Hold { return &x.h }
