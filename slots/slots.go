package slots

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// Unlimited is a limit that never binds.
const Unlimited = math.MaxInt

var (
	// ErrLimitReached: TryAcquire found no free capacity.
	ErrLimitReached = errors.New("slots: limit reached")
	// ErrQueueFull: more callers were already waiting than the queue allows;
	// the newest is rejected at once.
	ErrQueueFull = errors.New("slots: queue full")
	// ErrWaitTimeout: the maximum wait passed without admission (fail-closed).
	ErrWaitTimeout = errors.New("slots: wait timeout")
	// ErrNilContext: Acquire was called with a nil context.
	ErrNilContext = errors.New("slots: nil context")
	// ErrExceedsLimit: an admission of n units (AcquireN) asked for more
	// than its cap can ever hold under the limit in force, so waiting
	// would never end: refused at once, or when a lowered limit leaves a
	// waiter too heavy. A limit of 0 is a pause and refuses nobody.
	ErrExceedsLimit = errors.New("slots: weight exceeds the limit")
	// ErrBadUnits: an admission asked for fewer than 1 unit or more than
	// MaxUnits.
	ErrBadUnits = errors.New("slots: units out of range")
)

// MaxUnits is the most units one admission may weigh.
const MaxUnits = core.MaxUnits

// CheckUnits returns an error wrapping ErrBadUnits for a weight n outside
// 1..MaxUnits, or nil: for an owner that takes weights, and a layer that
// refuses a bad one before any wait.
func CheckUnits(n int) error {
	if n < 1 || n > MaxUnits {
		return fmt.Errorf("%w: %d (want 1 to %d)", ErrBadUnits, n, MaxUnits)
	}
	return nil
}

// LimitError is a rejection with the numbers behind it.
type LimitError struct {
	Err error  // ErrLimitReached, ErrQueueFull, ErrWaitTimeout, ErrExceedsLimit or another package's reason
	Key string // the key that was at its limit; empty for a Limiter
	// Cap names which of an owner's caps refused, for an owner with
	// several kinds: a pacing Gate says "provider", "model", "api_key",
	// "pacing", "pause", "tokens" or "model_tokens", or a budget such as
	// "tokens_per_minute" (see pacing.CapProvider), and InFlight and Limit
	// are that cap's (for the token caps, tokens; for a budget, the tokens
	// started in the last minute). Empty for a Limiter or a Registry (Key
	// names the cap). Unlike Key, it never names a tenant or a secret.
	Cap      string
	InFlight int // units held at the decision: holders, when each weighs one
	Limit    int // the limit at the decision
	Queued   int // waiters at the decision
	// RetryAfter is when to try again: when the slot this caller would
	// get is expected to free, from the holds' mean and the holders'
	// starts, behind the callers queued and those told to come back
	// earlier (so that callers refused together are spread over the time
	// slots free, not sent back at once), a little before it when the
	// caller could queue. To the millisecond, at least 1 ms; an HTTP
	// answer rounds it up to whole seconds in Retry-After and sends it as
	// it is in retry-after-ms (HeaderRetryAfterMs).
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	var key string
	if e.Key != "" {
		key = fmt.Sprintf("key %q: ", e.Key)
	}
	limit := fmt.Sprint(e.Limit)
	if e.Limit == Unlimited {
		limit = "unlimited"
	}
	return fmt.Sprintf("%v (%s%d in flight, limit %s, %d queued; retry after %v)",
		e.Err, key, e.InFlight, limit, e.Queued, e.RetryAfter)
}

func (e *LimitError) Unwrap() error { return e.Err }

// Slot is one admission: it holds one unit of capacity (of every key it was
// admitted under) until Release. The zero value and a nil *Slot hold nothing;
// their methods are no-ops. A Slot must not be copied (go vet's copylocks
// check reports copies); pass *Slot.
//
// Its fields belong to the package that admitted it: a Slot is declared
// over the record that every admission of this module fills in.
type Slot core.Handle

// hold returns the record of the admission inside s.
func (s *Slot) hold() *core.Hold { return (*core.Handle)(s).Hold() }

// tracked reports whether s stands in for a hold kept apart from it
// (leak detection); such a Slot must not be kept reachable by the library.
func (s *Slot) tracked() bool {
	_, ok := s.hold().Owner.(*core.Tracked)
	return ok
}

// holds reports whether s came from an admission.
func (s *Slot) holds() bool { return s != nil && s.hold().Owner != nil }

// Release frees the slot's capacity. It is safe to call from any goroutine and
// any number of times; it reports true only for the call that freed it.
func (s *Slot) Release() bool {
	if !s.holds() {
		return false
	}
	ok := s.hold().Release()
	// With leak detection, s must stay reachable until its cleanup has been
	// stopped, or a collection midway would report a leak that is not one.
	runtime.KeepAlive(s)
	return ok
}

// releaseQuietly frees the slot if it is still held, without counting a
// repeat as misuse; for the HTTP seams, where a body's EOF, its Close and
// its request's end may each be the last.
func (s *Slot) releaseQuietly() {
	if s.holds() {
		s.hold().ReleaseQuietly()
		runtime.KeepAlive(s) // see Release
	}
}

// Released reports whether Release has been called (or, for a slot whose
// holder's context ended as it was granted, whether it was given back).
func (s *Slot) Released() bool {
	if !s.holds() {
		return true
	}
	return s.hold().Released()
}

// Bypassed reports whether the slot was admitted by fail-open after the
// maximum wait: it holds no capacity, and the limit was saturated.
func (s *Slot) Bypassed() bool { return s.holds() && s.hold().Bypassed }

// Degraded reports whether the slot was admitted without its fleet-wide
// cap, because the store that keeps that cap could not be reached (see
// package registry/fleet): it holds only this process's local cap, or, if it
// is also Bypassed, nothing.
func (s *Slot) Degraded() bool { return s.holds() && s.hold().Degraded }

// AcquiredAt returns when the slot was admitted (granted, for a caller that
// waited), on the owner's clock. On the real clock it is accurate to about
// 10 ms: admissions share a coarse clock reading, since reading the clock
// costs about as much as the rest of an admission.
func (s *Slot) AcquiredAt() time.Time {
	if !s.holds() {
		return time.Time{}
	}
	return s.hold().Owner.Time(s.hold().At)
}

// Units returns the units of capacity the slot was admitted with: 1 unless
// it came from an AcquireN (or another N method) with more. A Bypassed slot
// holds none of them; a nil Slot reports 0.
func (s *Slot) Units() int {
	if !s.holds() {
		return 0
	}
	return s.hold().Units()
}

// ID returns the slot's holder id, unique within its Limiter or Registry; it
// is what leak and long-held reports name.
func (s *Slot) ID() uint64 {
	if !s.holds() {
		return 0
	}
	return s.hold().ID
}
