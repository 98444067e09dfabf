package fleet

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// virtualRedis is a miniredis served over in-memory connections, so that a
// fleet runs in a testing/synctest bubble, its Redis on the bubble's clock
// (TIME in the scripts too). A reply or a command may be delayed by latency
// each way, in virtual time. Keys with a TTL do not expire on it (miniredis
// expires keys only when told to): the tests that run on it need none to.
type virtualRedis struct {
	t       testing.TB
	srv     *miniredis.Miniredis
	latency time.Duration
	// jitter, if set, adds its draw to the latency of each write (in
	// order on each connection): calls on two connections may then pass
	// each other. It is called from many goroutines at once.
	jitter func() time.Duration
	// arrived, if set, is called with each write a client makes (a
	// command, or a pipeline of them) once the server has read it, before
	// the commands run (synctest.Wait for them to have run): a test can
	// act on Redis while a given call is there and its reply is not back.
	// Set it before the first Client dials; it is called from many
	// goroutines at once.
	arrived func(b []byte)
}

// newVirtualRedis starts a virtual Redis, closed at the test's end; call it
// in a synctest bubble.
func newVirtualRedis(t testing.TB, latency time.Duration) *virtualRedis {
	v := &virtualRedis{t: t, srv: miniredis.NewMiniRedis(), latency: latency}
	t.Cleanup(v.srv.Close)
	return v
}

// virtualPoolSize is the connection pool of a virtual Redis's client: more
// connections than a Registry of these tests has calls on their way at once
// (one per waiter at most, 4,500 in the largest test, and the background's),
// so that no call waits in the pool. go-redis's default, 10 per GOMAXPROCS,
// is 20 on two cores and 10 under the race detector (testrig.Bubble runs on
// one P). The claims of granted waiters went to the client at once,
// beside the pipelines (now up to maxClaiming, see calls.go); when a burst
// of releases granted hundreds of waiters, their claims held every
// connection of a pool that small, the
// next pipelines waited behind them for one (160 to 340 ms of virtual time,
// a round trip being 40 ms), and the calls queued behind those pipelines
// waited out the call timeout (500 ms): each a failure of Redis, the
// breaker opened, and waiters were admitted under the local caps alone
// (TestBurstOnManyKeysKeepsTheFleetCap). How many waiters a burst queues
// in Redis, and so how many claims follow, depends on the order in which
// the scheduler runs them, which the machine's load changes: the test
// failed now and then on a busy two-core machine, and every time at
// GOMAXPROCS=1 without the race detector. A call that waits in the pool
// also takes a timer from a sync.Pool that go-redis shares across the
// process: one made outside the bubble (by a test on a TCP miniredis) is
// not the bubble's, and the bubble's clock stops while a call waits on it.
const virtualPoolSize = 1 << 14

// redisServer is a Redis that tests open registries on: a real
// redis-server (redistest.Server) or a virtual one.
type redisServer interface {
	Client() *redis.Client
}

// Client is a go-redis client of v, closed at the test's end.
func (v *virtualRedis) Client() *redis.Client {
	t := v.t
	// No maintenance notifications: miniredis refuses their handshake, and
	// go-redis then holds a sync.RWMutex across a call to turn them off,
	// which would stop the bubble's clock. A pool that never makes a call
	// wait for a connection (see virtualPoolSize).
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", PoolSize: virtualPoolSize, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}, Dialer: func(context.Context, string, string) (net.Conn, error) {
		server, err := v.srv.Dial()
		if err != nil {
			return nil, err
		}
		return relay(server, v.latency, v.jitter, v.arrived), nil
	}})
	t.Cleanup(func() { c.Close() })
	return c
}

// relay returns a client end for server that buffers each way: net.Pipe
// alone blocks a writer until its reader reads, and miniredis writes each
// reply while go-redis may still be writing a pipeline, so the two would
// wait on each other. The buffer holds relayChunks writes, more than the
// replies to the longest pipeline the fleet sends (batchSize calls);
// past that a writer waits, as over a TCP window. arrived, if not nil, is
// called with each write of the client's once the server has read it.
func relay(server net.Conn, latency time.Duration, jitter func() time.Duration, arrived func([]byte)) net.Conn {
	client, mine := net.Pipe()
	go pump(server, mine, latency, jitter, nil)
	go pump(mine, server, latency, jitter, arrived)
	return client
}

const relayChunks = 4 * batchSize

// pump copies from src to dst, reading src as fast as it writes and
// delivering each chunk latency (and jitter's draw, if not nil) after it
// was read, in order; then, if delivered is not nil, calling it with the
// chunk.
func pump(src, dst net.Conn, latency time.Duration, jitter func() time.Duration, delivered func([]byte)) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, relayChunks)
	go func() {
		defer dst.Close()
		for c := range ch {
			time.Sleep(time.Until(c.at))
			if _, err := dst.Write(c.b); err != nil {
				src.Close()
				for range ch {
				}
				return
			}
			if delivered != nil {
				delivered(c.b)
			}
		}
	}()
	defer close(ch)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			d := latency
			if jitter != nil {
				d += jitter()
			}
			ch <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(d)}
		}
		if err != nil {
			return
		}
	}
}
