package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/internal/storediff"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// A differential check of the Redis store against memstore, the contract
// written out in Go (package storediff): the same random driver calls on
// both, on one fake clock (a miniredis), their answers compared. Knobs
// (environment, see storediff): DIFF_SEEDS (10 by default), DIFF_SEED0,
// DIFF_MULTI, DIFF_LIGHTMULTI, DIFF_SHORT, DIFF_STARTS, DIFF_KEYS,
// DIFF_CARRY, DIFF_BATCH, DIFF_TRACE (log the queue after each
// admission), and DIFF_REAL (a real redis-server, on its own clock).
// After each call of storediff.Run the Redis store's summaries of its
// queues are checked against walks of them (redisSide.Check).

// redisSide is the Redis store (on a miniredis on the pair's fake clock)
// for storediff: its config is the zero one.
type redisSide struct {
	t    *testing.T
	mini *redistest.Mini
	r    driver.Store
	// real is the redis-server the Redis store runs on with DIFF_REAL
	// (nil: the miniredis); zmembers and exists read whichever it is.
	real *redis.Client
}

var (
	_ storediff.Checker = (*redisSide)(nil)
	_ storediff.Tracer  = (*redisSide)(nil)
)

func newDiffPair(t *testing.T) *storediff.Pair {
	mini := redistest.StartMini(t)
	s := &redisSide{t: t, mini: mini, r: redisstore.New(mini.Client(), "h")}
	if os.Getenv("DIFF_REAL") != "" {
		s.real = redistest.Start(t).Client()
		s.r = redisstore.New(s.real, "h")
	}
	return storediff.New(t, mini.Now, s, storediff.Config{})
}

func (s *redisSide) Name() string        { return "redis" }
func (s *redisSide) Store() driver.Store { return s.r }

func (s *redisSide) SetClock(_ time.Time, d time.Duration) {
	s.mini.Advance(d)
	s.mini.Srv.FastForward(d)
}

func (s *redisSide) zmembers(k string) []string {
	if s.real != nil {
		m, _ := s.real.ZRange(context.Background(), k, 0, -1).Result()
		return m
	}
	m, _ := s.mini.Srv.ZMembers(k)
	return m
}

func (s *redisSide) Queued(key string) int { return len(s.zmembers("inflight:{h}:" + key + "#q")) }

func (s *redisSide) Leased(key, lease string) bool {
	return slices.Contains(s.zmembers("inflight:{h}:"+key), lease)
}

// Lose flushes the miniredis (with DIFF_REAL too).
func (s *redisSide) Lose() { s.mini.Srv.FlushAll() }

func (s *redisSide) Dump() {
	for _, k := range []string{"a", "b"} {
		base := "inflight:{h}:" + k
		q := s.zmembers(base + "#q")
		s.t.Logf("redis %s queue: %v", k, q)
		if s.mini.Srv.Exists(base + "#t") {
			f, _ := s.mini.Srv.HKeys(base + "#t")
			for _, x := range f {
				if strings.HasPrefix(x, "u|") || strings.HasPrefix(x, "w|") || strings.HasPrefix(x, "p|") {
					s.t.Logf("  %s = %s", x, s.mini.Srv.HGet(base+"#t", x))
				}
			}
		}
		s.t.Logf("redis %s leases: %v", k, s.zmembers(base))
	}
}

// Trace logs key a's queue (with each waiter's units) and leases.
func (s *redisSide) Trace(p *storediff.Pair) {
	q, _ := s.mini.Srv.ZMembers("inflight:{h}:a#q")
	var us []string
	for _, m := range q {
		id := m[len(m)-2:]
		u := ""
		if s.mini.Srv.Exists("inflight:{h}:a#t") {
			u = s.mini.Srv.HGet("inflight:{h}:a#t", "u|"+m[len(m)-32:])
		}
		us = append(us, m[:1]+":"+id+"("+u+")")
	}
	l, _ := s.mini.Srv.ZMembers("inflight:{h}:a")
	for i := range l {
		l[i] = l[i][30:]
	}
	p.Logf("   redis q %v leases %v", us, l)
}

// Check fails the run if the summary of key's queue on the Redis store
// (see clearBehind in summary.go) is not what a walk of the queue finds
// (the miniredis only).
func (s *redisSide) Check(p *storediff.Pair, key string) {
	if s.real != nil {
		return
	}
	srv, k := s.mini.Srv, "inflight:{h}:"+key
	q, _ := srv.ZMembers(k + "#q")
	if len(q) == 0 {
		return
	}
	marked := 0
	for _, m := range q {
		id := m[strings.LastIndex(m, "|")+1:]
		if strings.Contains(srv.HGet(k+"#t", "k|"+id), "],[") || srv.HGet(k+"#t", "u|"+id) != "" {
			marked++
		}
	}
	fields, _ := srv.HKeys(k + "#t")
	want := fmt.Sprint("1 ", marked, " ", len(fields)+len(q)<<24, " ", srv.HGet(k+"#v", "seq"))
	got := fmt.Sprint(srv.HGet(k+"#v", "xi"), " ", srv.HGet(k+"#v", "x"), " ", srv.HGet(k+"#v", "xe"), " ", srv.HGet(k+"#v", "xs"))
	if got != want {
		p.Fail("the summary of %s's queue (xi x xe xs) is %s, its walk %s", key, got, want)
	}
}

// TestDifferential drives both stores with the same random calls on
// one or two keys, small queues, waiters of one process that never dies.
func TestDifferential(t *testing.T) {
	multi := storediff.Multi()
	storediff.Seeds(t, 10, func(t *testing.T, seed uint64) { storediff.Run(newDiffPair(t), seed, multi) })
}

// TestDifferentialRenew drives one key with admissions of short and
// long TTLs, renewals (of held and of released leases), expiries and
// losses of the store's data.
func TestDifferentialRenew(t *testing.T) {
	storediff.Seeds(t, 10, func(t *testing.T, seed uint64) { storediff.RenewRun(newDiffPair(t), seed) })
}

// TestDifferentialBudget drives one budget with charges, corrections
// and moves on both stores.
func TestDifferentialBudget(t *testing.T) {
	for seed := range 20 {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { storediff.BudgetRun(newDiffPair(t), uint64(seed)) })
	}
}
