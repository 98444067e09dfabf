package core

import (
	"cmp"
	"context"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/clockx"
)

// Policy is how an owner's callers wait, and what it reports: set by
// options before the owner is used, read-only after. The zero value waits
// without bound, queues without bound, fails closed, uses the real clock
// and slog.Default, and reports to no one.
type Policy struct {
	MaxWait    time.Duration              // <= 0: wait until the context ends
	MaxQueue   int                        // with BoundQueue: at most this many waiters
	BoundQueue bool                       // false: the queue is unbounded
	FailOpen   bool                       // on MaxWait, admit a bypassed slot instead of failing
	Clock      clock.Clock                // nil: the real clock
	Logger     *slog.Logger               // nil: slog.Default() at the time of logging
	Observer   func(Event)                // nil: no events
	Wants      func(context.Context) bool // nil: all; else asked before an Event (ctx nil: none)
	LeakCheck  bool                       // reclaim and report Slots dropped while held
	LeakSites  bool                       // with LeakCheck: record where each slot was acquired

	MaxFlowQueue   int     // with BoundFlowQueue: at most this many waiters per flow
	BoundFlowQueue bool    // false: flows are not bounded apart from the queue
	Shares         *Shares // nil: no class has a guaranteed share
}

// SetShare sets class c's guaranteed share.
func (w *Policy) SetShare(c uint8, minimum, reserved int) {
	if w.Shares == nil {
		w.Shares = new(Shares)
	}
	w.Shares.Min[c], w.Shares.Reserved[c] = minimum, reserved
}

// QueueFull reports whether a caller finding waiting callers ahead must be
// rejected instead of queued.
func (w *Policy) QueueFull(waiting int) bool { return w.BoundQueue && waiting >= w.MaxQueue }

// Log returns the logger to use now.
func (w *Policy) Log() *slog.Logger { return cmp.Or(w.Logger, slog.Default()) }

// Every lets an event through at most once per interval; for log lines that
// must not flood under saturation. The zero value lets the first one through.
type Every struct{ next atomic.Int64 }

// Allow reports whether the event at now (nanoseconds, any monotonic origin)
// may be logged, and if so suppresses the following ones for interval.
func (e *Every) Allow(now int64, interval time.Duration) bool {
	next := e.next.Load()
	return (next == 0 || now >= next) && e.next.CompareAndSwap(next, now+int64(interval))
}

// HoldTime is a running estimate of how long holders keep their capacity,
// fed by a sample of releases. Lock-free; the zero value has no estimate.
type HoldTime struct {
	ewma    atomic.Int64
	samples atomic.Int32 // up to warmSamples
}

// Told is the returns told to the callers refused on a lane and not yet
// due, in order, with the units each needs: the callers expected back, who
// go before a caller refused later. A lane's Told (RejectLaneTurns) also
// counts the units freed on the lane (Lane.Remove) and books each return
// at the count by which it fits: a caller refused later goes behind the
// last return still to come of its class and of each higher one, an order
// their times alone do not keep (a caller refused for a full queue counts
// those queued ahead of it, who are told after it if they time out). Its
// owner's lock guards it.
type Told struct {
	dues  []End
	units int    // the dues' units together
	freed uint64 // the units freed on its lane since it was made
	// Elsewhere is the units of returns taken to be told elsewhere for
	// each unit told here (a fleet's other processes tell their own
	// callers of the same key's frees); 0: none. Its owner sets it.
	Elsewhere float64
	// last is, per class, the last return booked: when its room frees,
	// and the count of units freed by which it fits.
	last [NumClasses]struct {
		at  int64
		pos uint64
	}
}

// An End is a holder's start (Hold.At), or a return told, and its units.
type End struct {
	At    int64
	Units int
}

// Sampled reports whether the release of the hold numbered seq feeds the
// estimate: one in 16, spread over the sequence by a multiplicative hash
// (a fixed stride would see one of alternating workloads only), so that
// most releases do not read the clock; the first warmSamples releases all
// feed it (see Warming).
func Sampled(seq uint64) bool { return seq*0x9E3779B97F4A7C15>>60 == 0 }

// warmSamples is how many releases feed the estimate before sampling
// starts: a refusal soon after the start has an estimate to go by.
const warmSamples = 16

// Known reports whether the estimate has had a hold to go by.
func (t *HoldTime) Known() bool { return t.ewma.Load() > 0 }

// Mean returns the estimate (0 while it has had no hold).
func (t *HoldTime) Mean() time.Duration { return time.Duration(t.ewma.Load()) }

// Warming reports whether every release should feed the estimate still.
func (t *HoldTime) Warming() bool { return t.samples.Load() < warmSamples }

// Observe folds one hold duration (nanoseconds) into the estimate.
func (t *HoldTime) Observe(d int64) {
	if d < 0 {
		return
	}
	if t.samples.Load() < warmSamples {
		t.samples.Add(1)
	}
	// The first hold is the estimate (at least 1 ns, so that it is known). A
	// lost update under a race only drops one sample.
	old := cmp.Or(t.ewma.Load(), d)
	t.ewma.Store(max(old+(d-old)/8, 1))
}

// MaxRetryAfter caps the estimate: past an hour it says nothing useful.
const MaxRetryAfter = time.Hour

// toldRounds bounds the units a Told counts to this many rounds of the
// lane (and maxDues returns in all): a caller that asks again without
// waiting books a return each time, and past the bound it is told the
// bound's time without booking, so that a flood of refusals pushes the
// others' returns back by at most toldRounds mean holds.
const (
	toldRounds = 8
	maxDues    = 1024
)

// RetryAfter is when a caller of n units refused at now (nanoseconds on the
// caller's clock, the same for every call) should come back, with need
// units to free before it fits (its own and those queued, less those free)
// and, before them, those of the callers told (when told is not nil)
// to come back later than now: when that much is expected to have freed,
// lead earlier (a caller that can queue on its return is then in line as
// its room frees; 0 for one that cannot). Each holder frees its units a
// mean hold after it started, then every mean hold with the rest of the
// lane's limit (ends holds the holders' starts and units, in any order, or
// a sample of them; nil: limit units free every mean hold, evenly, from
// now). The return is booked in told, so that callers refused together
// come back one by one as room frees, rather than all at once into a full
// queue. Rounded up to the millisecond; one second when limit is not
// positive; at most MaxRetryAfter. Call under the lock that guards told.
func (t *HoldTime) RetryAfter(now int64, n, need, limit int, ends []End, lead time.Duration, told *Told) time.Duration {
	return t.retryAfter(now, n, Uncounted, need, limit, ends, lead, told)
}

// Uncounted is the class of a caller that a lane's Told does not place by
// the units freed on the lane (retryAfter).
const Uncounted = NumClasses

// retryAfter is RetryAfter for a caller of class c: on a lane's Told, it
// also goes behind the last return still to come of its class and of
// each higher one (Told), and its own is booked so, unless c is Uncounted.
// A return due within two ticks of the coarse clock (which lags by up to
// one) has come: its caller, told to the millisecond, may be this one.
func (t *HoldTime) retryAfter(now int64, n int, c uint8, need, limit int, ends []End, lead time.Duration, told *Told) time.Duration {
	if limit <= 0 {
		return time.Second
	}
	mean := float64(cmp.Or(t.ewma.Load(), int64(time.Second))) // never negative
	held := 0.0
	for _, h := range ends {
		held += float64(h.Units)
	}
	// Floats: no overflow. Past the units held over a lowered limit.
	bound := float64(toldRounds)*float64(limit) + max(held-float64(limit), 0)
	u := float64(need)
	book := false
	if told != nil {
		// Returns due before now have come back (or will not).
		i, _ := slices.BinarySearchFunc(told.dues, now, byAt)
		for _, d := range told.dues[:i] {
			told.units -= d.Units
		}
		told.dues = told.dues[:copy(told.dues, told.dues[i:])]
		if len(told.dues) == 0 && cap(told.dues) > 64 {
			told.dues = nil // a flood's list is given back once it is over
		}
		u += float64(told.units) * (1 + max(told.Elsewhere, 0))
		for k, d := range told.last { // on a lane: by the count of units freed, too
			if c < Uncounted && d.at > now+int64(2*clockx.CoarseTick) && rank[k] <= rank[c] && d.pos > told.freed {
				u = max(u, float64(d.pos-told.freed)+float64(max(n, 1)))
			}
		}
		book = len(told.dues) < maxDues && u-float64(n) < bound
	}
	u = min(u, bound+float64(max(n, 1)))
	pos := u // the units to free before it fits
	var at float64
	if u > 0 && len(ends) > 0 {
		slices.SortFunc(ends, func(a, b End) int { return byAt(a, b.At) })
		// Past the holders' units, every round of a mean hold frees the
		// limit, at the holders' ends' times.
		r := 0.0
		if u > held {
			r = math.Ceil((u - held) / float64(limit))
			u = math.Ceil((u - held - (r-1)*float64(limit)) * held / float64(limit))
		}
		j, over := 0, 0.0
		for ; j < len(ends)-1 && float64(ends[j].Units) < u; j++ {
			u -= float64(ends[j].Units)
			if float64(ends[j].At)+mean <= float64(now) {
				over += float64(ends[j].Units)
			}
		}
		at = float64(ends[j].At) + mean*(1+r)
		// Holders past their mean free any moment, spread over the next mean.
		at = max(at, float64(now)+mean*(r+over/held))
	} else { // or it fits the free units (refused for the queue): a unit's turn
		at = float64(now) + mean/float64(limit)*max(u, 1)
	}
	if book {
		due := End{int64(min(at, float64(now)+float64(MaxRetryAfter))), max(n, 1)}
		j, _ := slices.BinarySearchFunc(told.dues, due.At, byAt)
		told.dues = slices.Insert(told.dues, j, due)
		told.units += due.Units
		if c < Uncounted {
			told.last[c].at, told.last[c].pos = due.At, told.freed+uint64(pos)
		}
	}
	// The lead comes off before the bound: a long wait told less its lead
	// stays long. Rounded up to the millisecond, within 1 ms and
	// MaxRetryAfter: a client that honours it does not come back early.
	d := at - float64(max(lead, 0)) - float64(now)
	d = min(max(d, float64(time.Millisecond)), float64(MaxRetryAfter))
	return time.Duration(math.Ceil(d/float64(time.Millisecond))) * time.Millisecond
}

func byAt(d End, at int64) int { return cmp.Compare(d.At, at) }

// Settings is what the module's options set: the Policy, which every owner
// reads, and what a Registry alone reads (its options' types keep them
// from the other owners).
type Settings struct {
	Policy
	Shards      int
	MaxKeyBytes int
}

// Apply applies opts to st in order; a nil option is no option.
func Apply[O interface{ Apply(*Settings) }](st *Settings, opts []O) {
	for _, o := range opts {
		if any(o) != nil {
			o.Apply(st)
		}
	}
}
