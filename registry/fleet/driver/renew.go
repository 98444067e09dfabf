package driver

import "time"

// RenewCall renews leases in one atomic call.
//
// For each lease, on each of its keys: there and not expired, it is
// extended to now + TTL; else it is missing there. A lease missing from a
// key is put back on the keys it is missing from, unless it was abandoned:
// with ModePutBack, without a check; with ModeReassert, without a check if Epoch
// is not the store's epoch now (the store lost it), else (it expired, or
// it was not known to be in the store) only if every key it is missing
// from has room for its Units under its limit and new admissions are not
// paused. It is
// never extended where it is missing: a released lease does not come
// back. The epoch and pause are handled as in AdmitCall step 2 (a put-back
// with a check is refused while a pause is honoured and one of the
// lease's limits binds).
type RenewCall struct {
	TTL      time.Duration
	NotAfter int64
	Epoch    int64
	Pause    time.Duration
	Leases   []Renewal
}

// Renewal is a lease as a RenewCall sends it.
type Renewal struct {
	Lease  string
	Units  int // as AdmitCall's: what it weighs where it is put back
	Mode   Mode
	Epoch  int64 // the epoch it was last seen in (0: not known to be in the store)
	Keys   []string
	Limits []int
}

// Mode is what a renewal does with a lease it finds missing.
type Mode int8

// What a renewal does with a lease it finds missing.
const (
	ModeReport   Mode = iota // report it
	ModeReassert             // put it back: without a check if the epoch changed, else if there is room
	ModePutBack              // put it back without a check (admitted while the store was unreachable)
)

// RenewResult is how a renewal went: TooLate (nothing changed), or the
// epoch, and each lease's fate in the order sent.
type RenewResult struct {
	TooLate bool
	Epoch   int64
	Now     int64
	Leases  []Fate
}

// Fate is what a renewal did with a lease.
type Fate int8

// What a renewal did with a lease.
const (
	FateRenewed Fate = 0 // it was there, and was extended
	FatePutBack Fate = 1 // missing, put back without a check
	FateRoom    Fate = 2 // missing under the same epoch (expired), put back: there was room
	FateGone    Fate = 3 // missing, and not put back
)
