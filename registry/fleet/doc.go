// Package fleet caps how many requests are in flight per key across every
// process of a fleet, with leases in Redis.
//
// An upstream's concurrency limit is per account, not per process: with R
// gateway replicas each capping at N, the provider sees up to R×N. A fleet
// Registry holds one cap per key for all of them. It offers the registry
// admission contract (TryAcquire, Acquire, AcquireAll, TryAcquireAll, each
// returning a *slots.Slot) and keeps a local registry.Registry beside it that
// mirrors this process's holders, for sweeps, metrics and Stats.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	caps := fleet.New[string](rdb, "zai", slots.Unlimited) // one name per set of caps
//	defer caps.Close()
//	caps.SetLimit("zai", 5) // every gateway sets the same limits
//	s, err := caps.AcquireAll(ctx, "zai", "zai/glm-5")
//	if err != nil {
//		return err // *slots.LimitError, ErrUnavailable (FailClosed), or the context's error
//	}
//	defer s.Release() // or hand s to slots.WrapBody, as any Slot
//
// The sections below say how the cap holds: leases and their renewal, lost
// leases, waiting, and what happens while Redis cannot be reached (with the
// client settings that suit it).
//
// # Leases
//
// Each capped key is a Redis sorted set of leases: member = a random 128-bit
// lease id, score = its expiry on the Redis server's clock. One script call
// per admission drops expired leases, checks every key's limit and adds the
// lease to all of them, or to none; a retried call with the same lease id
// takes nothing twice. Limits are sent with each call, so they live in the
// process: SetLimit takes effect at the next admission. Admissions made at
// the same time share round trips: while calls are on their way to Redis,
// later ones queue and then go together as one pipeline (one write and one
// read for many), each still its own script call. An admission alone
// sends its call at once. A process's waiters on a key reach Redis in the
// order they came: a waiter's call goes in the pipeline after those of
// the waiters before it, not after their replies, so a burst on one key
// takes a round trip per pipeline of 128, not one per waiter.
//
// A lease does not expire under a live holder: one heartbeat goroutine per
// Registry renews every held lease each LeaseTTL/3, in batched calls, each
// bounded by the call timeout (at most LeaseTTL/3), so one renewal may fail
// and the next still comes in time; one that failed is made again at the
// probe interval (WithBreaker). Renewal extends only leases that still
// exist; what it does with a lease found missing is told below (Lost
// leases). A process that dies holding leases frees them when they expire,
// after at most LeaseTTL. A key expires in Redis with its latest lease, so
// processes with different LeaseTTLs (a rolling deploy that changes it) may
// share keys. The heartbeat and the releaser survive a panic in a client
// hook or a log handler: it is logged (at most once a minute), and they go
// on as after a failed call.
//
// Keys are checked before anything goes to Redis, by the local registry's
// rule (WithMaxKeyBytes): a key refused with registry.ErrInvalidKey is
// refused whether Redis is reachable or not, and by InFlight too. A caller
// whose context ends before its admission is recorded is not admitted, even
// if Redis admitted its lease: the lease is given back, and the caller gets
// the context's error.
//
// An acquire call that fails on the client's side (a timeout, the caller's
// context) may still run on the server, however late (a stalled server
// runs the calls waiting in its sockets when it resumes); its lease id is
// then abandoned: the lease is removed and a tombstone keeps a late call
// from adding it. So that no call runs very late, each call that may add a
// lease carries a deadline on the server's clock, which the client
// estimates from earlier replies: twice the call timeout after it is made.
// Past it the script refuses to run, and changes nothing.
//
// While Redis is healthy the cap is never exceeded: the script decides and
// records atomically. It holds across a loss of Redis's data too (a
// restart without persistence), at a cost: new admissions pause for up to
// one renewal round while live holders put their leases back (see Lost
// leases, for the conditions). It can be exceeded by design with
// FallbackLocal, until enough holders release: during an outage each
// process admits up to the cap alone (R processes: up to R times the cap),
// and those leases are put back when Redis returns (see When Redis is
// unreachable).
//
// Release frees the local mirror and queues the removal of the lease from
// every key (which hands it to the keys' waiters) for a background goroutine: it never
// waits for Redis, even while Redis hangs. A removal that fails is sent
// again with backoff (and as soon as the breaker closes) until it succeeds
// or its lease has expired. At most 65,536 removals wait at once; past that
// the oldest is dropped (Stats.RemovalsDropped) and its lease expires after
// at most LeaseTTL. An abandon is given up only once the calls that may add
// its lease id are past their deadlines (and, past the bound, if they were
// made before any reply told the server's clock). A second Release does
// nothing.
//
// # Lost leases
//
// A held lease can go missing from Redis in two ways, told apart by an
// epoch: a key per Registry name (<prefix>{<name>}#epoch, never a key
// name's) with no expiry, set by the first script that finds it missing to
// the server's time. A Registry records with each lease the epoch under
// which it last saw the lease in Redis. If the epoch is another now, Redis
// lost its data since (a restart without persistence, a failover to a
// replica without it, FLUSHALL): the holder is still working, so the lease
// is put back without a cap check (WithLostLeases(ReassertLost), the
// default). If the epoch is the same, the lease expired: its holder did
// not renew it in time (a process stopped or starved for longer than the
// TTL, renewals that kept failing) and others may have taken its place, so
// it goes back only if every key it is missing from has room; if one has
// not, it is lost: counted (Stats.Lost), logged, and the holder's context
// made by WithCancelOnLost is cancelled with the cause ErrLeaseLost, while
// later renewals try again, with the same check. A failover to a replica
// that had the epoch but not the lease, or a restart from a snapshot taken
// before the lease, looks like an expiry. With ReportLost a missing lease
// is only reported, and with CancelLost the holder's context is cancelled
// too; neither puts it back.
//
// While the lost leases are missing, new admissions would fill the empty
// keys on top of their holders. So once a loss is found, new admissions
// across the fleet wait for one renewal round: until the new epoch's
// birth plus LeaseTTL/3 and twice the call timeout (for the renewal's
// calls to end; at most LeaseTTL), on the server's clock. Meanwhile a
// TryAcquire fails with a *slots.LimitError whose reason is ErrPaused
// (errors.Is finds slots.ErrLimitReached in it too), naming the first key,
// with a RetryAfter for the end of the pause; an Acquire goes on waiting,
// until the pause ends or its context does; Stats.Paused counts the
// refused tries. Renewals, and leases put back without a check, do not
// wait: each live holder's heartbeat puts its leases back within the
// round (at once in a process whose admission met the loss), so that
// admissions resume against them. A process finds the loss when a reply
// tells another epoch than the one it last saw; each call sends that
// epoch, and the script that meets another one declares the pause.
//
// The cap then holds across the loss if every holder's process is alive
// and renews within the round. The exceptions:
//
//   - A holder whose renewals are slow (its process stopped or starved,
//     its calls failing for the whole round) finds its leases missing
//     after the pause, and puts them back without a check, as Redis lost
//     them: until enough holders release, the cap is exceeded by those
//     leases.
//   - A process that never reached Redis before the loss cannot tell it
//     from a first start (both leave no key): what it admits before any
//     process that saw the old epoch calls is not held back. The pause,
//     counted from the new epoch's birth, still covers the rest of the
//     round.
//   - Processes must all honour the pause, and renew within the round of
//     the process that declared it: a process whose LeaseTTL is longer
//     (a rolling deploy that lengthens WithLeaseTTL) renews in a longer
//     round, and its leases may come back after the pause.
//
// A second loss inside the round makes a new epoch, and a new pause. A
// pause is honoured to its end, whichever process's TTL set it; an end
// more than the larger of the asking process's LeaseTTL and 5 minutes
// past the epoch's birth, or past now (a server clock stepped back), is
// not honoured at all, whatever Redis holds. Every Registry declares the
// pause, whatever its WithLostLeases (its own holders may not come back,
// but other processes' may). An admission whose keys are all at
// slots.Unlimited is not paused.
//
// # Waiting
//
// The waiters of every process queue in one order, kept in Redis beside the
// key's leases: by priority class (slots.WithPriority), then in weighted
// turns between flows (slots.WithFlow, WithFlowWeight: start-time fair
// queuing, as in a local registry), then in arrival order within a flow. An
// Acquire that finds a key full takes its place in that key's queue in the
// same script call. Whatever frees capacity (a release, a withdrawn
// waiter, a lease found expired) hands it to the first waiter that can
// take it: the script grants it a lease for a claim window (the smaller of
// a second and LeaseTTL/3) and publishes its ticket on its own process's
// channel, so that only that waiter wakes; its claim, one more script
// call, extends the lease to the TTL. A newcomer (TryAcquire too) never
// passes a waiter that could take the room (among the first 128 in line;
// one further back takes it on its own next call). Classes' shares
// (WithShare) do not apply to these waits.
//
// An AcquireAll waits on each of its keys, holding nothing until all have
// room for it. Once a key has passed it over registry.MaxPassed times, it
// is one of the key's urgent waiters; the key keeps one place for the one
// that came first, which binds only the callers that came after it (one
// place, however many are urgent: each kept place idles until its
// waiter's other keys have room). So it is served once its other keys
// have room, and kept places never deadlock, whatever the order of keys.
//
// A waiter asks again at least once a claim window, in case a wake-up was
// lost (pub/sub delivers at most once; after its subscription is made
// again, every waiter of the process asks at once), and these calls renew
// its process's liveness, whose TTL is five claim windows (at most
// LeaseTTL). A grant that nobody claims (its waiter died, or stalled for the
// claim window) costs the key that window. A process whose waiters stopped
// asking (it was killed) has its tickets dropped 1.5 claim windows before
// its liveness deadline, so that they delay the other waiters by less than
// the liveness TTL. A waiter whose context ends withdraws its place (or the
// grant it had not claimed yet) through the releaser, without waiting for
// Redis; Close takes its process's waiters out at once. A waiter granted
// under a limit higher than its own now gives the grant back and waits
// again.
//
// The wait options given to WithLocalOptions bound these waits as they
// bound a local registry's: slots.WithMaxQueue bounds each key's queue and
// slots.WithMaxQueuePerFlow a flow's part of it, fleet wide, and a caller
// over a bound fails at once with a *slots.LimitError wrapping
// slots.ErrQueueFull, with a RetryAfter estimated from the queue's length
// and how long this process's holders keep their leases; slots.WithMaxWait
// bounds a wait, past which the caller leaves the queue and fails with a
// *slots.LimitError wrapping slots.ErrWaitTimeout, or, with
// slots.WithFailOpen, is admitted with a Bypassed Slot that holds nothing
// (counted in Stats.Bypassed, logged at most once every 10 seconds).
//
// While new admissions are paused (Lost leases) nothing is granted, and
// while Redis cannot be reached the waiters of each process wait in its own
// order (class, then arrival, per key), polling with jittered backoff
// (WithPoll) and woken by this process's releases.
//
// # Learned caps
//
// A key's limit may be learned from the upstream's answers rather than
// configured, one cap for the whole fleet (Learn):
//
//	caps.Learn("zai", pacing.AdaptiveConfig{Max: 64}) // every gateway alike
//	s, err := caps.Acquire(ctx, "zai")
//	...
//	resp, err := upstream.RoundTrip(req)
//	caps.Report(s, pacing.Classify(resp, nil)) // before s is released
//
// The evidence is the fleet's: an admission's count is the key's lease
// count in Redis with it, so a 429 reported by one gateway lowers the cap
// of all of them, and a count one of them saw admitted raises it for all.
// A lease stays in that count until its removal, sent in the background
// after its release, reaches Redis: on a busy machine, where removals lag,
// counts run over what the upstream has, and an admission at such a count
// can take the cap over the upstream's until the refusals that follow
// bring it back.
// How the cap moves (probes, cuts, re-tests) is pacing's learned cap (see
// pacing.AdaptiveConfig), with its state kept in Redis, one per key,
// beside the key's leases; each process applies its own evidence to its
// copy at once and writes it to Redis in the background, and the others
// read the change within a message's delay. A configured limit (SetLimit,
// the LimitFunc, the default) stays the ceiling. Learned reports the cap
// as this process knows it; each change is logged at info.
//
// While Redis is unreachable each process goes on under the cap as it
// last knew it, and evidence waits (the latest 256 per key) to be written.
// A state Redis lost is written back as the processes knew it.
//
// # When Redis is unreachable
//
// A breaker opens after consecutive failures (WithBreaker), so that while
// Redis is down an admission costs no round trip; a background probe puts
// the leases taken meanwhile into Redis and closes it again. An admission
// whose call fails, and every admission while the breaker is open, does
// what WithUnavailable says: FallbackLocal (the default) admits under this
// process's local registry alone, with the same limits, and the Slot
// reports Degraded. FailClosed fails with ErrUnavailable. FailOpen admits a
// Bypassed, Degraded Slot that holds nothing.
//
// A Degraded lease is put into Redis, without a cap check, once Redis
// answers, and counts against this process's admissions from then on: the
// next admission's script call carries in the Degraded leases that share a
// key with it (up to 256 (key, lease) pairs; the heartbeat takes the rest
// moments later) before it decides, and the heartbeat puts them all in
// within the probe interval (WithBreaker), also when the breaker never
// opened. Until then, other processes do not count them.
//
// Give the client short timeouts so that a dead Redis fails fast, and let
// it honour each call's deadline (ContextTimeoutEnabled; without it the
// client's own timeouts bound the calls, not WithTimeout):
//
//	redis.NewClient(&redis.Options{
//		Addr:                  "127.0.0.1:6379",
//		DialTimeout:           250 * time.Millisecond,
//		ReadTimeout:           250 * time.Millisecond,
//		WriteTimeout:          250 * time.Millisecond,
//		ContextTimeoutEnabled: true, // honour each call's context deadline
//		MaxRetries:            1,
//		Protocol:              2, // RESP3's push notifications cost a check per call
//	})
//
// Every key of a Registry shares one Redis Cluster hash tag, its name (its
// epoch and pause keys too), so any AcquireAll runs as one script on Redis
// Cluster; all of a Registry's keys live on one node of the cluster. Keys are named with fmt.Sprint
// unless Keys.Name says otherwise (NewWithKeys): give struct keys a name, so
// that different keys cannot share a name.
package fleet
