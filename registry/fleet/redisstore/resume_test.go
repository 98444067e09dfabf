package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// A serving that goes on past its look bound passes over the waiters of
// several keys the servings before it passed (passedBy) only while they
// are still queued: fleettest's LightWaiterSlidBeforeTheLookBound, where
// X, passed over by the newcomer's serving of a, is granted through b
// before the look further on a grants V and L. A pass counted for X would
// leave a stray p|X field in a's hash of tickets (and a count of passes
// for a ticket queued again under that id).
func TestResumedServingPassesOnlyQueuedWaiters(t *testing.T) {
	c := redistest.Start(t).ClientFor(t)
	s := redisstore.New(c, "f")
	ctx := context.Background()
	call := statusCaller(t, s)
	const lim = 10
	require.Equal(t, driver.StatusAdmitted, call("Gb", []string{"b"}, 1, []int{lim}, false))
	require.Equal(t, driver.StatusAdmitted, call("Gc", []string{"c"}, 1, []int{1}, false))
	require.Equal(t, driver.StatusAdmitted, call("P", []string{"a"}, 7, []int{lim}, false))
	require.Equal(t, driver.StatusAdmitted, call("Q", []string{"a"}, 3, []int{lim}, false))
	require.Equal(t, driver.StatusQueued, call("Hb", []string{"b", "d"}, 2, []int{2, lim}, true))
	require.Equal(t, driver.StatusQueued, call("X", []string{"a", "b"}, 1, []int{lim, lim}, true))
	for i := range driver.PassScan - 1 {
		require.Equal(t, driver.StatusQueued, call(fmt.Sprint("F", i), []string{"a", "c"}, 1, []int{lim, 1}, true))
	}
	for _, l := range []string{"V", "L"} {
		require.Equal(t, driver.StatusQueued, call(l, []string{"a"}, 1, []int{lim}, true))
	}
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: time.Hour, Claim: time.Minute,
		Pairs: []driver.Release{{Key: "a", Lease: "Q", Limit: lim}}}))
	require.Equal(t, driver.StatusFull, call("N", []string{"a", "b"}, 1, []int{lim, lim}, false))
	n, err := s.Count(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, lim, n, "X, V and L granted")
	// Every count of passes in a hash of tickets is a queued ticket's.
	T := redisstore.KeyOf(s, "a") + "#t"
	fields, err := c.HGetAll(ctx, T).Result()
	require.NoError(t, err)
	for f := range fields {
		if id, ok := strings.CutPrefix(f, "p|"); ok {
			_, queued := fields[id]
			require.True(t, queued, "%s: passes counted for %s, not queued on a", f, id)
		}
	}
}

// A release of n pairs on a key whose queue holds n blocks of a light
// waiter of the key and PassScan waiters of it and another key, held up
// there: serving the key n times, each going PassScan waiters further,
// grants the n light waiters, each past the waiters of several keys
// before it. A waiter passed registry.MaxPassed times is urgent, and
// passing it again changes nothing: the passes counted, and the looks at
// whether a waiter passed by a serving before is still queued, come to a
// few per waiter, not one per waiter before it per grant (and per
// serving): with the carried waiters checked at each serving and passed at
// each grant, a release of 256 pairs over 256 such blocks ran 5 s in one
// script, the server serving nobody else meanwhile.
func TestResumedServingsPassEachWaiterAFewTimes(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.PatientClientFor(t, time.Minute)
	s := redisstore.New(c, "f")
	ctx := context.Background()
	call := statusCaller(t, s)
	const n = 64
	require.Equal(t, driver.StatusAdmitted, call("Gc", []string{"c"}, 1, []int{1}, false))
	var pairs []driver.Release
	for i := range n {
		id := fmt.Sprint("H", i)
		require.Equal(t, driver.StatusAdmitted, call(id, []string{"a"}, 1, []int{n}, false))
		pairs = append(pairs, driver.Release{Key: "a", Lease: id, Limit: n})
	}
	for j := range n {
		require.Equal(t, driver.StatusQueued, call(fmt.Sprint("L", j), []string{"a"}, 1, []int{n}, true))
		for i := range driver.PassScan {
			require.Equal(t, driver.StatusQueued, call(fmt.Sprint("W", j, "-", i), []string{"a", "c"}, 1, []int{n, 1}, true))
		}
	}
	require.NoError(t, c.ConfigResetStat(ctx).Err())
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: time.Hour, Claim: time.Minute, Pairs: pairs}))
	stats, err := c.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	calls := func(cmd string) int {
		for _, line := range strings.Split(stats, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				v, _, _ := strings.Cut(rest, ",")
				x, err := strconv.Atoi(v)
				require.NoError(t, err)
				return x
			}
		}
		return 0
	}
	waiters := n * driver.PassScan
	got := calls("hexists") + calls("hincrby")
	t.Logf("HEXISTS %d, HINCRBY %d for %d waiters", calls("hexists"), calls("hincrby"), waiters)
	assert.LessOrEqual(t, got, 2*(registry.MaxPassed+1)*waiters, "looks and passes: a few per waiter")
	count, err := s.Count(ctx, "a")
	require.NoError(t, err)
	assert.Equal(t, n-1, count, "the light waiters but one: a keeps a place for the first waiter of several keys, urgent")
}

// statusCaller returns call, which makes lease id's call on keys (their
// limits) for units on s, waiting if wait, and returns its status.
func statusCaller(t *testing.T, s driver.Store) func(id string, keys []string, units int, limits []int, wait bool) driver.Status {
	return func(id string, keys []string, units int, limits []int, wait bool) driver.Status {
		t.Helper()
		r, err := s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: id, Keys: keys, Limits: limits, Units: units,
			TTL: time.Hour, Claim: time.Minute, Live: time.Hour, Wait: wait, Flow: "f", Weight: 1, Proc: "p",
			MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		return r.Status
	}
}
