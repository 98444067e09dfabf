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
//   - flow.go: the admission flow every owner runs, written once: Begin,
//     the owner's Decision under its lock, then Finish: the Slot handed
//     out, refused, or waited for, and each way a wait ends (fail-open
//     too), with their events.
//   - wait.go: a blocked caller (Waiter), its grant and its wait (Await).
//   - engine.go: the rest around an owner's decisions (Engine):
//     rejections and their Retry-After, releases, misuse, leaks;
//     policy.go, events.go: what it is configured with and what it
//     reports.
//   - tracked.go: leak detection.
//
// Locking: a Lane and the Waiters queued on it belong to their owner's
// lock (the Limiter's mutex, a registry shard's mutex, the Gate's mutex);
// the owner decides under it. Nothing here locks.
package core
