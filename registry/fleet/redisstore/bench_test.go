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
// round trip and the bare hand-off (bareHandOffs) on the same server in
// the same run. It reports the medians, and the hand-off's over each of
// the others.
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
	bare := bareHandOffs(b, srv, 1000)
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
	slices.Sort(bare)
	p, h, bh := ping[len(ping)/2], hand[len(hand)/2], bare[len(bare)/2]
	b.ReportMetric(float64(p.Microseconds()), "ping-p50-µs")
	b.ReportMetric(float64(bh.Microseconds()), "bare-p50-µs")
	b.ReportMetric(float64(h.Microseconds()), "handoff-p50-µs")
	b.ReportMetric(float64(h)/float64(p), "handoff/ping")
	b.ReportMetric(float64(bh)/float64(p), "bare/ping")
	b.ReportMetric(float64(h)/float64(bh), "handoff/bare")
}

// bareHandOffs times n hand-offs made of the steps no hand-off through a
// store does without, on srv: a script that removes the holder's lease,
// grants the waiter its lease and publishes the waiter's id; a subscriber
// that receives it on its own connection and wakes the waiter (another
// goroutine, as one subscription serves a process's waiters); and the
// waiter's claim, one more script. Each is timed from the release's call
// to the claim's return. The release is made at once, where a Registry
// hands it to its releaser, so that Release never waits for the store.
func bareHandOffs(b *testing.B, srv *redistest.Server, n int) []time.Duration {
	ctx := context.Background()
	rel, claimer := srv.Client(), srv.Client()
	sub := srv.Client().Subscribe(ctx, "bare-wake")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // subscribed
		b.Fatal(err)
	}
	wake, claimed := make(chan string, 1), make(chan time.Time, 1)
	go func() { // the subscriber
		for {
			m, err := sub.ReceiveMessage(ctx)
			if err != nil {
				close(wake)
				return
			}
			wake <- m.Payload
		}
	}()
	go func() { // the waiter
		for id := range wake {
			if err := bareClaim.Run(ctx, claimer, []string{"bare-h"}, id).Err(); err != nil {
				b.Error(err)
			}
			claimed <- time.Now()
		}
	}()
	holder := "w0"
	if err := rel.ZAdd(ctx, "bare-h", redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: holder}).Err(); err != nil {
		b.Fatal(err)
	}
	out := make([]time.Duration, 0, n)
	for i := 1; i <= n; i++ {
		next := "w" + strconv.Itoa(i)
		t0 := time.Now()
		if err := bareRelease.Run(ctx, rel, []string{"bare-h"}, holder, next).Err(); err != nil {
			b.Fatal(err)
		}
		out = append(out, (<-claimed).Sub(t0))
		holder = next
	}
	return out
}

// bareRelease removes a lease and grants the next waiter a lease of a
// second, then wakes it: KEYS the key; ARGV the holder, the waiter.
var bareRelease = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now + 1000, ARGV[2])
redis.call('PUBLISH', 'bare-wake', ARGV[2])
return 1
`)

// bareClaim extends a granted lease to a minute: KEYS the key; ARGV the
// waiter.
var bareClaim = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', now + 60000, ARGV[1])
`)

// BenchmarkFleet runs the conformance suite's measurements
// (fleettest.Bench) on a real redis-server:
//
//	go test -run '^$' -bench Fleet -benchtime 1x ./registry/fleet/redisstore
func BenchmarkFleet(b *testing.B) { fleettest.Bench(b, standalone{redistest.Start(b)}) }
