// Package core is the admission engine that every owner of capacity in the
// module runs: the Limiter (one lane), the Registry (a lane per key), the
// pacing Gate (a provider lane with model and key lanes, and start times)
// and, through its local Registry, a fleet Registry.
//
//   - hold.go: the record of one admission (Hold) inside the user's Slot
//     (Handle), and the Owner that frees it.
//   - lane.go: a pool of capacity (Lane): its holders, its waiters, the
//     classes' shares, and the choice of the next waiter (Candidate).
//   - queue.go: the order of a lane's waiters: classes, flows' turns,
//     arrival.
//   - wait.go: a blocked caller (Waiter), its grant and its wait (Await).
//   - engine.go: everything around an owner's decision (Engine): Slots,
//     waits, rejections, fail-open, releases, misuse, leaks, and the events
//     and logs of each; policy.go, events.go: what it is configured with
//     and what it reports.
//   - tracked.go: leak detection.
//
// Locking: a Lane and the Waiters queued on it belong to their owner's
// lock (the Limiter's mutex, a registry shard's mutex, the Gate's mutex);
// the owner decides under it. Nothing here locks.
package core
