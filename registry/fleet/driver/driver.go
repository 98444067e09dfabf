// Package driver is the contract between the fleet client (package fleet)
// and a store its processes share, as database/sql/driver is between
// database/sql and a database: a store implements Store, and its module
// imports this package, never the client. The fleet's PROTOCOL.md tells
// what the client does with each operation; the comments here tell what a
// store must do. Package fleettest holds the conformance suite every store
// passes; package memstore is the contract written out plainly in Go, in
// memory, to read beside it.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Store is what the processes of a fleet share: the few operations that
// must be atomic in one place. The fleet client (fleet.Registry) keeps
// everything else (the local mirror, renewals, removals, the breaker, its
// waiters, the learned caps' evidence) and reaches the store only through
// this interface.
//
// Keys are named by the client (Keys.Name); a store maps each to its own
// names. A lease is an id (random, 32 hex digits) on one or more keys,
// weighing its units (1 or more, the same on each of its keys: a request's
// tokens, say). A key's count is the sum of the units of its leases not
// expired, and a lease of u units has room on a key under limit L when the
// count plus u is at most L; every count a store reports and every limit
// it checks is in units. A store keeps, per key, its leases with their
// expiry and units and its queue of
// tickets; per fleet, an epoch, a pause, the processes' liveness and the
// learned caps' states. Every time is the store's own clock, in
// milliseconds unless said otherwise (Now in each reply): processes need
// not agree on the time.
//
// A lease's TTL runs only while the store is heard. A store keeps, per
// fleet, when it last ran a call that carries a TTL (heard; it may keep it
// up to TTL/16 coarse, a step to spare writes). A call with a TTL that
// finds more than TTL/2 since was not heard from by anyone: every live
// process calls at least each TTL/3 (a renewal, with no lease if it holds
// none), so the store hung, or every process was cut off from it or
// stopped. The live holders could not renew, so no lease that had not
// expired at heard (the silence's start) expires before now + TTL: they
// renew once they reach the store, and no newcomer takes their room
// before. Then, and on any call with a TTL, heard is now. A call that
// finds its clock before heard (a clock stepped back) finds no silence.
// The caller's TTL judges, and sets the grace's length: with processes of
// different TTLs (a rolling deploy that changes it), a silence shorter
// than half the caller's TTL is not found, and a holder of a longer TTL
// may renew after the grace. A silence that began inside a grace (the
// store hung again before the holders could renew) keeps the grace's
// start, but graces that follow one another hold a lease five minutes at
// most (a fleet whose only calls are far apart, from processes that never
// live through a renewal round). The cost: a lease whose holder died, or
// was released but its removal given up, before or during a silence keeps
// its room up to TTL after it. A store may hold other leases until the
// grace ends too, and may bound how long a silence it honours (the Redis
// store keeps a key of leases five minutes past its latest lease: after a
// longer silence the leases are gone, and their holders put them back
// only if there is room). Count honours a silence another call found.
//
// Each method's call is atomic on its own: a call that returns an error may
// or may not have run (the client then takes back what it may have added,
// with Abandon). An admission or a renewal must change nothing once the
// store's clock has passed its NotAfter (when not 0). Methods may be called
// from many goroutines at once. A reply that is not shaped as its
// operation's is an error that wraps ErrBadReply: the client counts it as
// the store's bug, not as the store being unreachable.
type Store interface {
	// AdmitOne makes one admission call at once.
	AdmitOne(ctx context.Context, call *AdmitCall) (AdmitResult, error)
	// Admit makes each call, in order, each atomically, in one round trip
	// if the store can. It returns one result per call (a failed call has
	// its Err), or an error for all of them.
	Admit(ctx context.Context, calls []*AdmitCall) ([]AdmitResult, error)
	// Renew extends, puts back or reports each lease of call, atomically.
	Renew(ctx context.Context, call *RenewCall) (RenewResult, error)
	// Release removes each (key, lease) pair and, unless new admissions
	// are paused, hands the freed room to the head of the key's queue.
	Release(ctx context.Context, call *ReleaseCall) error
	// Abandon takes back what an admission call that failed on the
	// client's side may do (see AbandonCall), for each call; it returns
	// one error per call (nil: done), or an error for all.
	Abandon(ctx context.Context, calls []*AbandonCall) ([]error, error)
	// Leave takes proc out of the liveness the store keeps: its tickets
	// are dropped when next met.
	Leave(ctx context.Context, proc string) error
	// Ping tells whether the store answers.
	Ping(ctx context.Context) error
	// Count returns the units of key's leases not expired now (a silence
	// honoured, see above).
	Count(ctx context.Context, key string) (int, error)
	// Listen delivers to l the grants made to proc's tickets and the
	// learned states published, until ctx ends; it returns then. It
	// tells l Listening once it listens, and each time it listens anew
	// after a break: what was sent before, the first time too, may be
	// missed, and the client asks again. A break includes a connection
	// lost without a word: a store checks a quiet one (both shipped
	// stores have a WithListenCheck), or waiters hear of their grants
	// only when they ask again.
	Listen(ctx context.Context, proc string, l Listener)
	// SyncLearned reads key's learned state and, with a State to write,
	// writes it if the store has the version presumed, and publishes it
	// to every process's Listen; see LearnedCall. The client keeps two
	// kinds of state this way, each a record of its own key: learned caps,
	// and Overrides (whose key starts with a NUL).
	SyncLearned(ctx context.Context, call *LearnedCall) (LearnedResult, error)
	// Budget charges a cost to a budget per minute if it fits, or
	// corrects a charge made before; see BudgetCall.
	Budget(ctx context.Context, call *BudgetCall) (BudgetResult, error)
}

// Pipeliner is a Store whose Admit makes its calls in one round trip (a
// pipeline). The fleet's client sends the claims of grants made together
// (a release that served many waiters of one process) in Admit calls only
// to a Pipeliner whose Pipelines reports true; to any other store, each
// claim goes at once in an AdmitOne of its own, beside the others, as a
// store whose Admit makes one call after another would keep them waiting.
// The client asks once, when it is made. A wrapper of a Store (for
// metrics, say) passes Pipelines on: embedding the Store interface hides
// it, and the claims of a burst of grants then take a connection each.
type Pipeliner interface {
	Store
	// Pipelines reports whether Admit makes its calls in one round trip.
	Pipelines() bool
}

// ErrBadReply is wrapped by the error of a store's reply that is not
// shaped as its operation's.
var ErrBadReply = errors.New("fleet driver: the store's reply is not its operation's")

// Listener receives what Store.Listen delivers. Its methods are called on
// Listen's goroutine, one at a time, and must not block for long.
type Listener interface {
	// Listening tells that Listen listens: the first time, or anew after
	// a break. What was sent before it may have been missed.
	Listening()
	// Granted tells that the ticket (a lease id) was granted room, or
	// that its waiter should ask again now: a store may send it for a
	// ticket whose grant is held up (pgstore, for a key another call
	// holds). The waiter's next call asks as a claim does, and finds it
	// granted or still queued.
	Granted(ticket string)
	// Learned tells a learned state that a SyncLearned published.
	Learned(state string)
}

// AdmitCall asks for a lease on every key or on none, or, with Wait, a
// place in the fleet's queue of every key.
//
// In order, the store:
//  1. refuses it (StatusTooLate) if its clock is past NotAfter;
//  2. reads the epoch, making it if missing (its clock in microseconds);
//     if Epoch is another one and Pause is not 0, declares a pause of new
//     admissions until the epoch's birth plus min(Pause, TTL), unless one
//     is declared; a pause that ends more than max(TTL, 5 min) after the
//     birth or after now is not honoured; the call is paused if a pause
//     is honoured and one of its limits binds (is below slots.Unlimited);
//  3. puts each Carried pair on its key, without a cap check, unless its
//     lease was abandoned;
//  4. refuses it (StatusAbandoned) if Lease was abandoned;
//  5. for a ticket of several keys queued already, records Limits as its
//     limits; unless paused, serves the queue of each key (see
//     ReleaseCall); a store may skip serving for a call with Wait whose
//     Lease is on every key, where no lease has expired and no key is
//     over its limit (a claim: it frees nothing, and step 6 admits it),
//     and for an ask of a ticket queued already that no key has room for
//     (each full for its Units, or its first waiter heavy: one that
//     serving stops at, or, for a ticket of several keys, one of one key
//     that serving goes past and the ticket may not pass): room no release
//     served (a raised limit, a lapsed grant) is then served at the next
//     call that serves, the ask of a waiter that fits it included;
//  6. if Lease is on every key, not expired (a grant claimed), extends it
//     to TTL and admits it, unless a key holds more than its limit (the
//     grant was made under a higher limit): then it gives the grant back,
//     serves the queues, and goes on as a newcomer that may queue past
//     MaxQueue and MaxFlowQueue; a grant on some of its keys only (a part
//     whose claim ran out) is dropped;
//  7. if paused, refuses it (StatusPaused), renewing a queued ticket's
//     Proc liveness and place's expiry first (a pause outlasts them);
//  8. a ticket queued already stays queued (StatusQueued), renewing Proc's
//     liveness and its place's expiry, unless serving stopped short of it
//     (not at a heavy waiter: see ReleaseCall) and it can take room on
//     every key: then it is admitted;
//  9. a newcomer (a call whose Lease is on none of its keys, an expired
//     lease counting as none) is admitted if every key has room for its
//     Units, serving stopped at no heavy waiter of a key, and no waiter it
//     has looked at could take that room; else, without Wait, refused
//     (StatusFull); with Wait, refused if a queue is at MaxQueue
//     (StatusQueueMax) or its flow at MaxFlowQueue (StatusFlowMax), else
//     queued on every key (StatusQueued), its ticket being Lease.
//
// An admission puts Lease on every key with the expiry now + TTL, weighing
// Units there; a ticket keeps its Units, and a grant weighs them.
type AdmitCall struct {
	Lease  string
	Keys   []string
	Limits []int // each key's limit (slots.Unlimited: none)
	// Units is what the lease weighs on each key, 1 to slots.MaxUnits (0
	// is taken as 1). The client never sends more than a key's limit.
	Units int
	TTL   time.Duration
	// NotAfter is the latest time of the store's clock at which the call
	// may still change anything (0: none).
	NotAfter int64
	// Epoch is the epoch the caller last saw (0: none); Pause is how long
	// it asks new admissions to wait after a loss (0: it does not ask).
	Epoch int64
	Pause time.Duration
	Wait  bool // queue if a key is full
	// Starts asks an admission's result for Start and Counts (a learned
	// key).
	Starts bool
	// Claim is how long a waiter has to claim a grant; Live how long Proc
	// counts as alive after a call that queues or keeps a ticket queued,
	// at least 3 Claim windows (a store may rely on it: the fleet's client
	// sets 3 to 5). A store takes TTL and Claim as Millis has them, and
	// Live as LiveMillis.
	Claim, Live time.Duration
	// Class (0 first), Flow and Weight (>= 1) place a waiter in the queue:
	// by class, then flows' weighted turns counted in units (see
	// TurnCost), then arrival.
	Class  uint8
	Flow   string
	Weight int
	Proc   string
	// MaxQueue and MaxFlowQueue bound a key's queue and a flow's part of
	// it (-1: no bound).
	MaxQueue, MaxFlowQueue int
	// Carried are leases admitted while the store could not be reached,
	// put back with this call (see step 3).
	Carried []Pair
}

// Pair is one lease on one key, and its units there (0 is taken as 1).
type Pair struct {
	Key, Lease string
	Units      int
}

// Status is what became of an admission call.
type Status int8

// What became of an admission call.
const (
	StatusFull      Status = 0 // a key is full, and the caller does not wait
	StatusAdmitted  Status = 1
	StatusPaused    Status = 2 // new admissions wait after the store lost its data
	StatusQueued    Status = 3 // the ticket waits in the queue
	StatusQueueMax  Status = 4 // a key's queue is at its bound
	StatusFlowMax   Status = 5 // the caller's flow is at its bound in a queue
	StatusAbandoned Status = -1
	StatusTooLate   Status = -2 // the store's clock was past NotAfter: nothing changed
)

// AdmitResult is how an admission call went.
type AdmitResult struct {
	Err    error
	Status Status
	// Key is the index of the key that refused or that the ticket waits
	// on (-1: none); Count its count in units (with StatusPaused, the
	// first key's), Queue its queue's length in tickets (with
	// StatusFlowMax, the flow's part; with StatusQueued, counting this
	// ticket).
	Key          int
	Count, Queue int64
	// Earliest is when the earliest lease of Key expires (0: none); with
	// StatusPaused, when the pause ends.
	Earliest int64
	Now      int64 // the store's clock, ms
	Epoch    int64 // 0 with StatusTooLate
	// With Starts, an admission's start: the store's clock in
	// microseconds, and each key's units held, this one counted. Grants
	// not claimed yet are left out: this is what a learned cap takes the
	// upstream to have had in flight, and a grant's request is not there
	// yet (on a busy store a claim can take long enough for the grants to
	// be a good part of a key's leases).
	Start  int64
	Counts []int64
}

// ReleaseCall removes leases. Then, unless a pause of new admissions is
// declared (honoured or not; see AdmitCall step 2), the store serves the
// queue of each key it freed, in the order the keys first come, with all
// the units freed on it, under the lowest Limit the call's pairs give
// that key (a lease taken before a limit was raised carries the lower
// one: waiters the higher limit would let in wait for their next call).
// Where serving stops at a bound on the waiters it looks at, with room
// left, it may go on from there, up to once for each pair on the key,
// knowing the waiters of several keys before where it goes on as passed
// (it stops where one of them is heavy, below).
// While the key has room under that limit, serving drops expired leases
// and grants the first waiter that can take room for its units on all of
// its keys (a ticket of a dead process is dropped) a lease of Claim on
// each of its keys, and tells its process (Listen).
//
// A heavy waiter is one that has no room on this key for its units while
// they are at most Limit. Serving goes past a heavy waiter of one key
// until the units granted past it on that key (to waiters of one key,
// and to newcomers of one key that wait) count PassFactor times its own
// (Pass), looking at most PassScan waiters (from where serving starts, or
// past the first it passed); then it stops there, and no waiter behind it, nor a newcomer, takes the
// room meanwhile. It stops at once at a heavy waiter of several keys. A
// waiter of several keys passes no heavy waiter: it is not granted while
// one stands before it (by that waiter's own limit) in one of its keys'
// queues, nor while serving passed one on the key served. So a heavy
// waiter is never starved by lighter ones after it, and lighter ones use
// the units it cannot (as in the local registry). A waiter passed over
// for want of room on another of its keys is passed as before; one whose
// units are over Limit (a limit lowered under it: its process refuses
// it) is passed over too. With waiters of one unit each, serving is what
// it was without units.
type ReleaseCall struct {
	// TTL is the caller's lease TTL, for the store's silence (see Store);
	// 0: the call finds none.
	TTL time.Duration
	// Pause is as AdmitCall's: a store that finds on a call with a TTL
	// that it lost the latest writes (a failover) declares a pause of new
	// admissions (of Pause; a store's own length if 0), and serves
	// nothing.
	Pause time.Duration
	Claim time.Duration
	Pairs []Release
}

// Release is one lease on one key, with the key's limit.
type Release struct {
	Key, Lease string
	Limit      int
}

// AbandonCall takes Lease out of its keys' queues and leases, and marks it
// abandoned, so that an admission call for it that runs later adds
// nothing: for TTL, and at least until the store's clock passes NotAfter
// (0: none), the latest not-after time of the calls that may add it; it
// runs however late it comes. With Limits, it then serves the keys'
// queues, as a release.
type AbandonCall struct {
	Lease    string
	Keys     []string
	Limits   []int // nil: no serving
	TTL      time.Duration
	NotAfter int64
	Pause    time.Duration // as ReleaseCall's
	Claim    time.Duration
}

// LearnedCall reads a key's learned state and, with State, writes it if
// the store's state has the version Presumed ("-": no state; "?": one
// without a version), publishing it. The version of a state is its "v"
// (the digits of its first "v" member).
type LearnedCall struct {
	Key      string
	Presumed string
	State    string // "": a read
	TTL      time.Duration
}

// LearnedResult is how a LearnedCall went: Wrote (with PublishErr if it
// could not be published), or the store's version and state (Found false:
// none). A state read is kept from expiring.
type LearnedResult struct {
	Wrote      bool
	PublishErr string
	Version    string
	State      string
	Found      bool
}

// BudgetCall charges Cost to the budget Key if it fits, or, with Correct,
// changes by Cost the charge made in Step, or, with Check, tells when Cost
// would fit.
//
// A budget counts, per part (0: all tokens, 1: input, 2: output), what was
// charged in each second of the store's clock (a step: its milliseconds
// divided by 1000); its window is the current step and the 60 before it,
// and what is older is forgotten (the store may drop a budget with nothing
// in its window). A part counts whether its limit is set or not.
//
// A charge fits if, for each part with a limit (Limits[i] > 0), the
// window holds nothing (a budget's first request always passes) or its
// count plus Cost[i] is at most the limit. Then it adds Cost to the
// current step and reports it (Charged, Step); else it changes nothing and
// reports At, the store's time (ms) at which the charge would fit as far
// as the steps now counted tell (when enough of them have left the
// window: step s leaves at (s+61)*1000), and Binding, the part that binds
// then.
//
// A correction (Correct) adds Cost[i], which may be negative, to step
// Step's part i while Step is in the window; once it has left, a positive
// Cost[i] is added to the current step (a debt) and a negative one is
// dropped. No step's part goes below zero: a store that lost its data
// does not take back what it forgot (nor count the window short of its
// charges). It is always Charged; one of zero reads Used. With Move, the
// correction moves the charge Cost made in Step to the current step: it
// takes Cost from Step, if it is still in the window, and adds it to the
// current step; nothing when Step is the current step.
//
// A check (Check, whatever Correct and Move say) charges nothing and
// answers as a charge of Cost that did not fit would (Charged false, At,
// Binding), At being 0 if Cost fits now: a client refused by one budget
// asks it of another it has not charged, to tell its caller when both
// will take the request. Like a read, it writes nothing.
//
// Used is each part's count in the window after the call. The calls of
// one budget are atomic with respect to each other, and each reads the
// store's clock once it has the budget to itself. A store's clock set
// back does not move the window back: the current step is never earlier
// than the latest step charged. A correction of zero writes nothing.
// Costs and limits are below MaxBudgetCost in absolute value (the client
// sends at most 2*slots.MaxUnits); a store may refuse more.
type BudgetCall struct {
	Key     string
	Limits  [3]int64
	Cost    [3]int64
	Correct bool
	Move    bool // with Correct: see below
	Step    int64
	Check   bool
}

// BudgetResult is how a BudgetCall went.
type BudgetResult struct {
	Charged bool
	Step    int64 // the step charged (the current one for a correction or a check)
	Used    [3]int64
	At      int64 // not Charged: when the charge would fit, store ms (a check's: 0 if now)
	Binding int   // not Charged: the part that binds at At
	Now     int64 // store ms
}

// BudgetSteps is how many steps before the current one a budget's window
// holds.
const BudgetSteps = 60

// MaxBudgetCost bounds a BudgetCall's costs and limits: far below what
// every store counts exactly (Redis's scripts count in doubles).
const MaxBudgetCost = 1 << 40

// Fits reports whether cost fits a window whose parts count used, under
// limits, as BudgetCall says; a store may use it.
func Fits(limits, used, cost [3]int64) bool {
	for i, l := range limits {
		if l > 0 && used[i] > 0 && used[i]+cost[i] > l {
			return false
		}
	}
	return true
}

// FitAt returns when (store ms) cost fits a window whose steps are counts
// (oldest first, the first being step first) under limits, as BudgetCall
// says, and the part that binds then; a store may use it.
func FitAt(limits, cost [3]int64, first int64, counts [][3]int64) (at int64, binding int) {
	for i, l := range limits {
		if l <= 0 {
			continue
		}
		var left int64
		for _, c := range counts {
			left += c[i]
		}
		if left <= 0 || left+cost[i] <= l {
			continue
		}
		for j, c := range counts {
			left -= c[i]
			if left <= 0 || left+cost[i] <= l {
				if t := (first + int64(j) + BudgetSteps + 1) * 1000; t > at {
					at, binding = t, i
				}
				break
			}
		}
	}
	return at, binding
}

// BudgetReply is the BudgetResult of a store's reply as a list: charged (0
// or 1), the step, the three counts used, at, binding, now; a store may
// use it.
func BudgetReply(res []int64) (BudgetResult, error) {
	if len(res) != 8 {
		return BudgetResult{}, fmt.Errorf("%w: %v", ErrBadReply, res)
	}
	return BudgetResult{Charged: res[0] == 1, Step: res[1], Used: [3]int64{res[2], res[3], res[4]},
		At: res[5], Binding: int(res[6]), Now: res[7]}, nil
}

// Millis is d as a store takes a TTL or a claim window of any call
// (AdmitCall, RenewCall, ReleaseCall, AbandonCall, LearnedCall): whole
// milliseconds, at least one, so that what a call makes with it (a lease,
// a grant, a tombstone, a learned state) expires after the call's now.
func Millis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// LiveMillis is c.Live as a store takes it: whole milliseconds, and at
// least 3 claim windows as Millis has them, which the stores rely on.
func (c *AdmitCall) LiveMillis() int64 { return max(c.Live.Milliseconds(), 3*Millis(c.Claim)) }
