package slots

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

const (
	Unlimited = math.MaxInt   // a limit that never binds
	MaxUnits  = core.MaxUnits // the most units one admission may weigh
)

var (
	// ErrLimitReached: TryAcquire found no free capacity.
	ErrLimitReached = errors.New("slots: limit reached")
	// ErrQueueFull: the queue was full; the newest caller is refused.
	ErrQueueFull = errors.New("slots: queue full")
	// ErrWaitTimeout: the maximum wait passed without admission.
	ErrWaitTimeout = core.ErrWaitTimeout
	// ErrNilContext: Acquire was called with a nil context.
	ErrNilContext = core.ErrNilContext
	// ErrExceedsLimit: heavier than its cap can ever hold (HTTP 413).
	ErrExceedsLimit = core.ErrExceedsLimit
	// ErrBadUnits: an admission weighs less than 1 or more than MaxUnits.
	ErrBadUnits = core.ErrBadUnits
	// ErrBadPriority: ParsePriority met an unknown name (HTTPStatus: 400).
	ErrBadPriority = errors.New("slots: unknown priority")
	// ErrNotSent: a Transport's base wraps it for a request it chose not to send.
	ErrNotSent = errors.New("slots: request not sent")
)

// LimitError is a rejection with the numbers behind it.
type LimitError struct {
	Err        error         // ErrLimitReached, ErrQueueFull, ErrWaitTimeout, ErrExceedsLimit or another package's reason
	Key        string        // the key refused (a Gate's "provider/model", whichever Cap refused); empty for a Limiter
	Cap        string        // which of an owner's caps refused (a Gate's "model"); no tenant
	InFlight   int           // units held at the decision (holders, when each weighs one); a budget's: started in its last minute
	Limit      int           // the limit at the decision
	Queued     int           // waiters at the decision
	RetryAfter time.Duration // when the units it needs should free, after those told before it
}

func (e *LimitError) Error() string {
	// `key "k", cap "c": ` less an empty one's part (both: nothing); a
	// Gate's key names its provider and model whichever cap refused.
	key := strings.Replace(fmt.Sprintf("key %q, cap %q: ", e.Key, e.Cap), `, cap "": `, ": ", 1)
	key = strings.TrimPrefix(strings.TrimPrefix(key, `key "": `), `key "", `)
	what := "in flight"
	if strings.HasSuffix(e.Cap, "_per_minute") { // a budget's (pacing's and a fleet's Caps end so)
		what = "started in the last minute"
	}
	limit := fmt.Sprint(e.Limit)
	if e.Limit == Unlimited {
		limit = "unlimited"
	}
	var retry string // none for a refusal that coming back cannot help
	if e.RetryAfter > 0 {
		retry = fmt.Sprintf("; retry after %v", e.RetryAfter)
	}
	return fmt.Sprintf("%v (%s%d %s, limit %s, %d queued%s)", e.Err, key, e.InFlight, what, limit, e.Queued, retry)
}

func (e *LimitError) Unwrap() error { return e.Err }

// asError is a rejection as the module's owners return it.
func asError(r *core.Rejection) error { return (*LimitError)(r) }

// Slot is one admission, holding its units until Release; a nil or zero
// Slot holds nothing. A Slot must not be copied (go vet reports copies).
type Slot core.Handle

// hold returns the record of the admission inside s.
func (s *Slot) hold() *core.Hold { return (*core.Handle)(s).Hold() }

// holds reports whether s came from an admission.
func (s *Slot) holds() bool { return s != nil && s.hold().Owner != nil }

// Release frees the slot, from any goroutine; only the first call is true.
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

// Released reports whether the slot was released or given back.
func (s *Slot) Released() bool { return !s.holds() || s.hold().Released() }

// Bypassed reports whether fail-open admitted the slot without capacity.
func (s *Slot) Bypassed() bool { return s.holds() && s.hold().Bypassed }

// Degraded reports an admission without its fleet-wide cap (store down).
func (s *Slot) Degraded() bool { return s.holds() && s.hold().Degraded }

// AcquiredAt returns when the slot was admitted, to about 10 ms.
func (s *Slot) AcquiredAt() time.Time {
	if !s.holds() {
		return time.Time{}
	}
	return s.hold().Owner.Time(s.hold().At)
}

// Units returns the units the slot was admitted with (0 for nil).
func (s *Slot) Units() int {
	if !s.holds() {
		return 0
	}
	return s.hold().Units()
}

// ID returns the slot's id, unique within its owner, as reports name it.
func (s *Slot) ID() uint64 {
	if !s.holds() {
		return 0
	}
	return s.hold().ID
}
