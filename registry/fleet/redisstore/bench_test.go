package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// BenchmarkPairs measures TryAcquire + Release of a fleet Registry on one
// real redis-server, beside the bare semaphore the fleet's leases come
// from, on the same server in the same run: one script that drops expired
// leases, counts and adds, then a ZREM. Each reports pairs/s; the fleet's
// removals (sent in the background) are waited for before the clock
// stops. Run with
//
//	go test -run '^$' -bench Pairs -benchtime 3s ./registry/fleet/redisstore
func BenchmarkPairs(b *testing.B) {
	srv := redistest.Start(b)
	for _, callers := range []int{1, 16} {
		b.Run("bare-semaphore/callers-"+strconv.Itoa(callers), func(b *testing.B) {
			c := srv.Client()
			pairs(b, callers, func() {
				id := newID()
				ok, err := bareTake.Run(context.Background(), c, []string{"bare"}, id, time.Now().Add(time.Minute).UnixMilli(), time.Now().UnixMilli(), 1<<30).Int()
				if err != nil || ok != 1 {
					b.Error(ok, err)
					return
				}
				if err := c.ZRem(context.Background(), "bare", id).Err(); err != nil {
					b.Error(err)
				}
			}, func() {})
		})
		b.Run("fleet/callers-"+strconv.Itoa(callers), func(b *testing.B) {
			r := fleet.New[string](redisstore.New(srv.Client(), "bench-"+strconv.Itoa(callers)), 1<<30)
			defer r.Close()
			pairs(b, callers, func() {
				s, err := r.TryAcquire("k")
				if err != nil {
					b.Error(err)
					return
				}
				s.Release()
			}, func() {
				for { // the removals are part of the work
					n, err := r.InFlight(context.Background(), "k")
					if err != nil || n == 0 {
						return
					}
					runtime.Gosched()
				}
			})
		})
	}
}

// bareTake is the bare semaphore's admission: drop the expired, count,
// add if there is room. KEYS: the key; ARGV: id, expiry, now, limit.
var bareTake = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
`)

// pairs runs pair b.N times over callers goroutines, then drain, and
// reports pairs/s.
func pairs(b *testing.B, callers int, pair, drain func()) {
	per := max(b.N/callers, 1)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range per {
				pair()
			}
		})
	}
	wg.Wait()
	drain()
	b.ReportMetric(float64(per*callers)/time.Since(start).Seconds(), "pairs/s")
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// BenchmarkHandOff measures a release's hand-off to a waiter of another
// process: from Release in one process to Acquire's return in the other
// (the release's call, the wake-up, the waiter's claim), beside a PING's
// round trip on the same server in the same run. It reports both medians
// and their ratio, the hand-off in round trips.
func BenchmarkHandOff(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	c := srv.Client()
	var ping []time.Duration
	for range 1000 {
		t0 := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		ping = append(ping, time.Since(t0))
	}
	rs := []*fleet.Registry[string]{
		fleet.New[string](redisstore.New(srv.Client(), "handoff"), 1),
		fleet.New[string](redisstore.New(srv.Client(), "handoff"), 1),
	}
	defer rs[0].Close()
	defer rs[1].Close()
	held, err := rs[0].TryAcquire("k")
	if err != nil {
		b.Fatal(err)
	}
	var hand []time.Duration
	b.ResetTimer()
	for i := range b.N {
		waiter := rs[(i+1)%2]
		got := make(chan error, 1)
		var next *slots.Slot
		var at time.Time
		go func() {
			s, err := waiter.Acquire(ctx, "k")
			at, next = time.Now(), s
			got <- err
		}()
		for n := int64(0); n != 1; { // the waiter's place in the store's queue
			n, err = c.ZCard(ctx, "inflight:{handoff}:k#q").Result()
			if err != nil {
				b.Fatal(err)
			}
		}
		t0 := time.Now()
		held.Release()
		if err := <-got; err != nil {
			b.Fatal(err)
		}
		hand = append(hand, at.Sub(t0))
		held = next
	}
	b.StopTimer()
	held.Release()
	slices.Sort(ping)
	slices.Sort(hand)
	p, h := ping[len(ping)/2], hand[len(hand)/2]
	b.ReportMetric(float64(p.Microseconds()), "ping-p50-µs")
	b.ReportMetric(float64(h.Microseconds()), "handoff-p50-µs")
	b.ReportMetric(float64(h)/float64(p), "handoff/ping")
}

// BenchmarkFleet runs the conformance suite's measurements
// (fleettest.Bench) on a real redis-server:
//
//	go test -run '^$' -bench Fleet -benchtime 1x ./registry/fleet/redisstore
func BenchmarkFleet(b *testing.B) { fleettest.Bench(b, standalone{redistest.Start(b)}) }
