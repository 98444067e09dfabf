package fleet

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Unavailable is what a Registry does while the store cannot be reached.
type Unavailable int

const (
	// FallbackLocal admits under this process's local registry alone, with
	// the same limits; the Slot reports Degraded, and its lease is put into
	// the store once it answers again, before this process's next admission
	// is decided. The default.
	FallbackLocal Unavailable = iota
	// FailClosed fails with an *UnavailableError, which wraps
	// ErrUnavailable (slots.HTTPStatus answers 503 with its RetryAfter).
	FailClosed
	// FailOpen admits a Bypassed, Degraded Slot that holds no capacity.
	FailOpen
)

// ParseUnavailable parses "local", "closed" or "open".
func ParseUnavailable(s string) (Unavailable, error) {
	switch s {
	case "", "local":
		return FallbackLocal, nil
	case "closed":
		return FailClosed, nil
	case "open":
		return FailOpen, nil
	}
	return FallbackLocal, fmt.Errorf("fleet: %q is not local, closed or open", s)
}

// Lost is what the heartbeat does with a held lease it finds missing in
// the store: it lost its data (a restart without persistence, a failover to
// a replica that never had it), or the lease expired because its holder
// did not renew it in time (a process stopped or starved for longer than
// the lease TTL). PROTOCOL.md (Lost leases) tells how the two are told
// apart.
type Lost int

const (
	// ReassertLost puts back without a cap check a lease that the store lost
	// with its data: its holder is still working. New admissions wait
	// meanwhile, for one renewal round, so that the cap holds (see Lost
	// leases in PROTOCOL.md). A lease that expired goes
	// back only if every key it is missing from has room; if one has not,
	// it is lost: counted (Stats.Lost), logged, its holder's context made
	// by WithCancelOnLost is cancelled with the cause ErrLeaseLost, and the
	// next renewals try again to put it back, with the same check. The
	// default.
	ReassertLost Lost = iota
	// ReportLost only logs and counts it (Stats.Lost); the holder goes on
	// holding its local slot, uncounted in the store.
	ReportLost
	// CancelLost does what ReportLost does and cancels the holder's context
	// made by WithCancelOnLost, with the cause ErrLeaseLost: the holder
	// stops its work (an upstream request, say) and releases. Only slots
	// acquired with such a context (Acquire, AcquireAll) are cancelled;
	// TryAcquire takes no context.
	CancelLost
)

// DefaultLeaseTTL is the lease TTL unless WithLeaseTTL says otherwise.
const DefaultLeaseTTL = 30 * time.Second

// An Option configures a Registry; a nil one is ignored.
type Option interface{ apply(*config) }

// optionFunc adapts a function to Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	ttl           time.Duration
	onUnavailable Unavailable
	lost          Lost
	breakAfter    int32
	probeEvery    time.Duration
	opTimeout     time.Duration
	pollMin       time.Duration
	pollMax       time.Duration
	logger        *slog.Logger
	local         []registry.Option
	observer      slots.Observer // nil: none
	learnedFormat int            // of the learned states written (WithLearnedFormat)
}

// defaultProbeEvery is how often an open breaker probes the store, by
// default (WithBreaker).
const defaultProbeEvery = 250 * time.Millisecond

func defaults() config {
	return config{
		ttl:        DefaultLeaseTTL,
		breakAfter: 3,
		probeEvery: defaultProbeEvery,
		opTimeout:  500 * time.Millisecond,
		pollMin:    10 * time.Millisecond,
		pollMax:    500 * time.Millisecond,

		learnedFormat: learnedFormat,
	}
}

func (c *config) log() *slog.Logger {
	if c.logger != nil {
		return c.logger
	}
	return slog.Default()
}

// MaxLeaseTTL bounds WithLeaseTTL: a day, longer than a dead process's
// slots should stay taken, and far from where a lease's expiry, the
// store's clock plus the TTL, would overflow (as "never", math.MaxInt64,
// did: the lease counted for nothing).
const MaxLeaseTTL = 24 * time.Hour

// WithLeaseTTL sets how long a lease outlives its last renewal: how soon a
// dead process's slots free up. The heartbeat renews every ttl/3. It panics
// if ttl is under 30 ms or over MaxLeaseTTL.
func WithLeaseTTL(ttl time.Duration) Option {
	if ttl < 30*time.Millisecond || ttl > MaxLeaseTTL {
		panic(fmt.Sprintf("fleet: lease TTL %v not within 30ms and %v", ttl, MaxLeaseTTL))
	}
	return optionFunc(func(c *config) { c.ttl = ttl })
}

// WithLearnedFormat sets the format of the learned states this process
// writes (PROTOCOL.md, Learned caps): 2, the default, or 1, the only one
// that releases before format 2 read. Set 1 on every process for a rolling
// deploy from such a release, so that the fleet goes on sharing its
// learned caps, and drop it once every process runs this release; set it
// too before rolling back to one. With 1, a state read in format 2 is
// written over in format 1. It panics for any other format.
func WithLearnedFormat(f int) Option {
	if f != 1 && f != learnedFormat {
		panic(fmt.Sprintf("fleet: learned state format %d: 1 or %d", f, learnedFormat))
	}
	return optionFunc(func(c *config) { c.learnedFormat = f })
}

// WithUnavailable sets what happens while the store cannot be reached (default
// FallbackLocal): while the breaker is open, and for an admission whose
// call fails (a waiter's call that times out is made again, while the
// breaker stays closed: see PROTOCOL.md).
func WithUnavailable(u Unavailable) Option {
	return optionFunc(func(c *config) { c.onUnavailable = u })
}

// WithLostLeases sets what the heartbeat does with a lease it finds missing
// (default ReassertLost).
func WithLostLeases(l Lost) Option { return optionFunc(func(c *config) { c.lost = l }) }

// WithBreaker opens the breaker after n consecutive failed calls (default
// 3) and probes the store every probe while it is open (default 250 ms), and
// at each renewal's time (LeaseTTL/3) if that comes sooner; at the probe
// interval, while the breaker is closed, it puts into the store the leases
// admitted under the local registry alone when a call failed, and makes
// again a renewal that failed. A Registry that holds no lease renews too,
// with none (the store must hear every live process: see driver.Store), so
// its calls count here like any other's. An n past math.MaxInt32 counts as
// math.MaxInt32. It panics if n < 1 or probe <= 0.
func WithBreaker(n int, probe time.Duration) Option {
	if n < 1 || probe <= 0 {
		panic(fmt.Sprintf("fleet: WithBreaker(%d, %v): need n >= 1 and probe > 0", n, probe))
	}
	// Converted as it is, a larger n would wrap (to a negative threshold, or
	// 0), and the breaker would open at the first failed call.
	return optionFunc(func(c *config) { c.breakAfter, c.probeEvery = int32(min(n, math.MaxInt32)), probe })
}

// WithTimeout bounds each call to the store on the request path (default 500
// ms, and at most a third of the lease TTL; a context deadline that comes
// sooner wins). A call that queues behind others for a pipeline is sent
// within d or given up (counted as a failure), and then has d more: an
// admission's call ends within 2d. It panics if d <= 0.
func WithTimeout(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("fleet: WithTimeout(%v)", d))
	}
	return optionFunc(func(c *config) { c.opTimeout = d })
}

// WithPoll sets the backoff of a waiting Acquire between tries while it
// cannot wait in the fleet's queue (the store unreachable, or its call
// timed out: see WithUnavailable): from min, doubling
// to max, jittered (defaults 10 ms and 500 ms); a release in this process
// wakes a waiter sooner. Removals from the store that fail are sent again with
// the same backoff. It panics unless 0 < min <= max.
func WithPoll(minimum, maximum time.Duration) Option {
	if minimum <= 0 || maximum < minimum {
		panic(fmt.Sprintf("fleet: WithPoll(%v, %v)", minimum, maximum))
	}
	return optionFunc(func(c *config) { c.pollMin, c.pollMax = minimum, maximum })
}

// WithLogger sets the logger (nil, the default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// WithLocalOptions passes options to the local registry (Local), which
// mirrors this process's holders and, while the store is unavailable under
// FallbackLocal, caps alone. What each option does there:
//   - slots.WithMaxWait, WithMaxQueue, WithMaxQueuePerFlow and WithFailOpen
//     bound the fleet's waits as well;
//   - registry.WithMaxKeyBytes is the fleet's key rule: a key it refuses
//     fails with registry.ErrInvalidKey before anything is sent to the
//     store, whether the store is reachable or not;
//   - slots.WithShare applies to callers of Local alone: the fleet's queue
//     orders by class without shares, and its admissions under the local
//     registry (also while the store is unavailable) are all made as the
//     default class, so units reserved for a class go unused there;
//   - slots.WithClock, WithLogger and registry.WithShards apply to the
//     local registry alone, and so to waits only while the store is
//     unavailable: the fleet's queue runs on the real clock and logs to
//     this package's WithLogger;
//   - slots.WithObserver sees the local registry's admissions, made after
//     the store's decision, without a context or a wait; this package's
//     WithObserver replaces it;
//   - slots.WithLeakDetection finds nothing: the fleet keeps a Slot's
//     local hold until the Slot is released.
func WithLocalOptions(opts ...registry.Option) Option {
	return optionFunc(func(c *config) { c.local = append(c.local, opts...) })
}

// WithObserver sets an Observer of the fleet's admissions, as
// slots.WithObserver does for a Limiter: the outcome of each Acquire, with
// the caller's context (for a span on it) and its whole wait, the store's
// queue included; of each TryAcquire, without a context; and each release
// and double release of a slot (fleet slots are not tracked for leaks).
// It replaces an Observer given through WithLocalOptions, which would see
// the local registry's admissions alone: made after the store's decision,
// with no context and no wait. Observe is called without locks; if it
// panics on an admission, the slot is released and the panic goes on up.
func WithObserver(o slots.Observer) Option { return optionFunc(func(c *config) { c.observer = o }) }
