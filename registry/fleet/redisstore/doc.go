// Package redisstore keeps a fleet's leases in Redis (standalone, Sentinel
// or Cluster): a driver.Store for package fleet.
//
//	store := redisstore.New(rdb, "gateway") // every process of the fleet uses the same name
//	caps := fleet.New[string](store, 64)
//	defer caps.Close()
//
// Each operation is one Lua script, run atomically on the server, with
// every time taken from the server's clock (TIME): the processes need not
// agree on the time. A key's leases are a sorted set scored by expiry;
// the units of those that weigh more than one (AcquireN) are in a hash
// beside it, and its queue of waiters is kept beside it too; grants and
// learned caps are published on pub/sub channels, one per process for
// grants. Every key of a fleet shares one hash tag, its name, so that an
// admission on several keys is one script on a Cluster too.
//
// A lease of one unit is stored as the release before this one stored
// every lease, so a rolling deploy from it is safe while no lease weighs
// more. The scripts of that release count a weighted lease as one unit,
// and leave its extra units counted when they drop it expired: a fleet
// that weighs its leases needs every process at this release (or later)
// before its first weighted call.
//
// A key whose name has a '#' or starts "abandoned:", and a flow whose name
// has a '|', are kept under marked names since this release: the release
// before took a key named k#w for the units of k, say, and k#q for its
// queue, and so admitted past a cap and lost waiters. A process of that
// release still does, so a fleet whose keys or flows may have such names
// (names that come from requests: an org's, a tenant's) should not run
// both releases at once: stop the old before the new starts, or keep such
// names out of both until every process runs this one. Other names are
// kept as before.
//
// Give the client short timeouts, so that a dead server fails fast, but
// no shorter than the fleet's fleet.WithTimeout (500 ms by default), and
// let it honour each call's deadline: go-redis ends a read at the sooner
// of its ReadTimeout and the call's deadline, so a shorter one would cut
// every call the fleet makes.
//
//	redis.NewClient(&redis.Options{
//		Addr:                  "127.0.0.1:6379",
//		DialTimeout:           250 * time.Millisecond,
//		ReadTimeout:           500 * time.Millisecond, // the fleet's WithTimeout, or more
//		WriteTimeout:          500 * time.Millisecond,
//		ContextTimeoutEnabled: true, // honour each call's context deadline
//		MaxRetries:            1,
//		Protocol:              2, // RESP3's push notifications cost a check per call
//		PoolSize:              64,
//	})
//
// Give it connections for the calls that run at once: about 22 for a
// Registry. It sends its admissions in at most two calls and their
// pipelines at a time, and the claims of its grants in up to 16 calls and
// their pipelines (a wrapper of the Store must pass driver.Pipeliner on),
// so a release that grants many waiters at once takes no more; its
// heartbeat, its releaser, its learned caps' sync and its subscription
// take one each. A fleet Budget makes a call of its own for each
// reservation and settlement; it counts in <prefix>{<name>}#budget:<key>,
// and each call that charges keeps its reply in
// <prefix>{<name>}#budgetcall:<id> for ten seconds or so, so that a call
// go-redis sends again after a lost reply runs once (an ACL that names the
// fleet's keys must name both). With too few connections (go-redis's default
// pool has ten per GOMAXPROCS) and a server some milliseconds away, calls
// wait for one, the calls behind them may pass their deadline, and
// admissions fall back to the fleet's WithUnavailable meanwhile.
//
// Without persistence, a restart of the server loses every lease: the
// fleet tells it by an epoch kept beside the keys, and new admissions wait
// while the live holders put their leases back (see the fleet's
// PROTOCOL.md). A failover to a replica may lose the latest leases: the
// scripts find it by the server's replication IDs (INFO replication,
// which an ACL must then allow), and new admissions wait the same way.
// Package redistest runs real redis-servers for tests.
//
// A hang of the server (or a silence of every process) longer than half
// the lease TTL does not let newcomers take the room of live holders:
// leases count their TTL only while the server is heard (driver.Store),
// kept in <prefix>{<name>}#heard, a key new in this release beside
// #epoch, #pause and #procs (an ACL that names the fleet's keys one by one
// must name it too). A key of leases lives five minutes past its latest
// lease, so that the leases are there after such a silence.
//
// The server must not evict the fleet's keys: give it maxmemory-policy
// noeviction, or no memory limit (a managed Redis's default policy is
// often volatile-lru). A key's leases evicted look expired, not lost: the
// epoch stays, and others may take their place over live holders. Listen
// logs a warning when the server it reaches may evict them.
package redisstore
