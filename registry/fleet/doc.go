// Package fleet caps how many requests are in flight per key across every
// process of a fleet, with leases in a store they share: Redis (package
// registry/fleet/redisstore), PostgreSQL (registry/fleet/pgstore), or any
// implementation of driver.Store. Each store is a module of its own: a
// program links the client of the store it uses, and nothing else.
// Package memstore keeps a fleet in one process's memory, for tests.
//
// An upstream's concurrency limit is per account, not per process: with R
// gateway replicas each capping at N, the provider sees up to R×N. A fleet
// Registry holds one cap per key for all of them. It offers the registry
// admission contract (TryAcquire, Acquire, AcquireAll, TryAcquireAll, each
// returning a *slots.Slot) and keeps a local registry.Registry beside it that
// mirrors this process's holders, for sweeps, metrics and Stats.
//
//	store := redisstore.New(rdb, "zai") // one name per set of caps; or pgstore.New
//	caps := fleet.New[string](store, slots.Unlimited)
//	defer caps.Close()
//	caps.SetLimit("zai", 5) // every gateway sets the same limits
//	s, err := caps.AcquireAll(ctx, "zai", "zai/glm-5")
//	if err != nil {
//		return err // *slots.LimitError, ErrUnavailable, or the context's error
//	}
//	defer s.Release() // or hand s to slots.WrapBody, as any Slot
//
// What holds:
//
//   - While the store answers, a key never has more holders than its limit
//     across the fleet: each admission is decided and recorded atomically
//     in the store, on every key or none, on the store's clock.
//   - A lease lives while its holder does: the heartbeat renews every held
//     lease each LeaseTTL/3; a process that dies frees its leases after at
//     most LeaseTTL. Release does not wait for the store (but one that
//     races Close, which removes its lease itself, within a call
//     timeout). A lease's TTL runs
//     only while the store is heard: after a silence of more than half of
//     it (the store hung, or every process was cut off from it), the
//     leases it found are held a TTL more, so that their holders renew
//     before anyone takes their room (PROTOCOL.md, A silent store).
//   - If the store loses its data (Redis restarted without persistence or
//     failed over to a replica, PostgreSQL recovered from a crash with
//     asynchronous commits), new
//     admissions across the fleet wait one renewal round (ErrPaused) while
//     live holders put their leases back, so the cap holds across the loss.
//   - Waiters of every process stand in one queue per key: by priority
//     class (slots.WithPriority), then weighted turns between flows
//     (slots.WithFlow, WithFlowWeight), then arrival. A release hands the
//     room to the head; a newcomer never passes a waiter that could take
//     it. slots.WithMaxQueue, WithMaxQueuePerFlow and WithMaxWait bound
//     the waits (WithLocalOptions).
//   - A Slot may weigh what its request costs (AcquireN, AcquireAllN: a
//     prompt's tokens on a self-hosted server). A key's count is then the
//     sum of its leases' units, its limit a limit in units, and flows'
//     turns are counted in units; lighter waiters of one key pass a heavy
//     one up to a bound, as on one process (slots.Limiter.AcquireN), so
//     the units it cannot use do not stand idle and it is never starved.
//     Every process of a fleet
//     that uses weights must run a release that knows them: an older one
//     counts a weighted lease as one.
//   - While the store cannot be reached, WithUnavailable decides:
//     FallbackLocal (the default) admits under this process's local caps
//     alone (R processes: up to R times the cap, by design) and puts those
//     leases into the store once it answers; FailClosed refuses
//     (*UnavailableError, with a RetryAfter that grows with the outage);
//     FailOpen admits a Bypassed Slot.
//   - A learned cap (Learn, Report) is the fleet's: a 429 reported by one
//     process lowers it for all of them. Deploying over (or rolling back
//     to) a release that reads only format 1 of its state: WithLearnedFormat.
//   - A Budget per minute (NewBudget: tokens, input and output apart,
//     requests) is the fleet's: a request reserves its estimate before it
//     starts (ReserveAll: of a provider's, a model's and a tenant's at
//     once, all or nothing) and settles it with what it used.
//   - An operator's change (Overrides: an org's cap raised, a tenant turned
//     off) made through one process holds on all of them and outlives
//     their restarts, kept in the store.
//
// Give the store's client short timeouts, so that a dead store fails
// fast (see each store's package). Keys are named with fmt.Sprint unless
// Keys.Name says otherwise: give struct keys a name, so that different
// keys cannot share one.
//
// PROTOCOL.md, beside this package's code, tells how it works: leases and
// their renewal, lost leases and the pause, the queue and its hand-off,
// learned caps, and what happens while the store is unreachable.
package fleet
