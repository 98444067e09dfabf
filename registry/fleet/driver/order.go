package driver

// The order of a key's queue: flows' turns, and how far waiters pass a
// heavy waiter.

import "github.com/inflight-go/inflight/internal/core"

// A key's queue orders the flows of a class by start-time fair queuing: a
// waiter's start tag is its flow's finish tag there or the class's
// virtual time (the start tag last granted), whichever is later, and it
// moves its flow's finish tag on by TurnCost(units, limit)/Weight, up to
// MaxTag. Tags compare to the microunit, so that turns that meet
// (1/3+1/3+1/3 against 1) go by arrival.

// TurnSteps is how finely a key's turns count units: in steps of its
// limit/TurnSteps, so that a key of tokens is not counted token by token.
const TurnSteps = 1000

// TurnCost returns what a waiter of units costs its flow's turn on a key
// of limit: its units in steps of max(1, limit/TurnSteps), rounded up. A
// waiter of one unit costs 1, as it did when turns counted waiters; a
// waiter of the whole limit costs less than 2*TurnSteps.
func TurnCost(units, limit int) int {
	step := max(1, limit/TurnSteps)
	return (max(units, 1) + step - 1) / step
}

// PassFactor and PassScan bound how far waiters pass a heavy waiter of
// one key, as the local owners do (see ReleaseCall): until the units
// granted past it (Pass) reach PassFactor times its own, looking at most
// PassScan waiters (a store may count them from where serving starts).
const (
	PassFactor = core.PassFactor
	PassScan   = core.PassScan
)

// Pass returns what n units granted past a heavy waiter count against it:
// n for a waiter of its flow and class, 2*PassFactor*n for one of
// another (other flows take at most half its units past it).
func Pass(other bool, n int) int64 {
	if other {
		return 2 * PassFactor * int64(n)
	}
	return int64(n)
}

// MaxTag is the most a flow's finish tag reaches. Tags start from 0 each
// time a key's queue empties; a backlog that never does and moves them
// past MaxTag (4e9 turn costs per weight granted) is served by arrival
// until it empties, and its waiters that leave give no turn back. Below
// it a float64 keeps tags to the microunit.
const MaxTag = 4e9
