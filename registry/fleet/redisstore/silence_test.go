package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// silenceCall makes lease's call on key (limit 1, a TTL of a second, a
// claim window of 100 ms) on s, with the epoch it last saw.
func silenceCall(t *testing.T, s driver.Store, epoch *int64, lease, key string, wait bool) driver.AdmitResult {
	t.Helper()
	res, err := s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: lease, Keys: []string{key}, Limits: []int{1}, Units: 1,
		TTL: time.Second, Claim: 100 * time.Millisecond, Live: time.Minute, Weight: 1, Proc: "p-" + lease,
		MaxQueue: -1, MaxFlowQueue: -1, Epoch: *epoch, Wait: wait})
	require.NoError(t, err)
	*epoch = res.Epoch
	return res
}

// A second silence that begins right after the call that found the first
// (Redis hung again before the holder could renew) keeps the first one's
// start: the holder's lease, held by the first grace, is held by the
// second too, and the newcomer after it is refused. (The second grace
// counted from the newcomer's call, after the lease's expiry, and let the
// next newcomer in.) As memstore does.
func TestSilenceRightAfterAGrace(t *testing.T) {
	m := redistest.StartMini(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, st := range []struct {
		name    string
		s       driver.Store
		advance func(time.Duration)
	}{
		{"redis", redisstore.New(m.Client(), "t"), func(d time.Duration) { m.Advance(d); m.Srv.FastForward(d) }},
		{"memstore", memstore.NewWithClock(func() time.Time { return now }), func(d time.Duration) { now = now.Add(d) }},
	} {
		t.Run(st.name, func(t *testing.T) {
			var epoch int64
			require.Equal(t, driver.StatusAdmitted, silenceCall(t, st.s, &epoch, "held", "k", false).Status)
			st.advance(2 * time.Second) // the first hang
			assert.Equal(t, driver.StatusFull, silenceCall(t, st.s, &epoch, "x", "k", false).Status, "after the first hang")
			st.advance(10*time.Millisecond + 2*time.Second) // the second, at once
			assert.Equal(t, driver.StatusFull, silenceCall(t, st.s, &epoch, "y", "k", false).Status, "after the second hang")
			res, err := st.s.Renew(context.Background(), &driver.RenewCall{TTL: time.Second, Epoch: epoch, Leases: []driver.Renewal{
				{Lease: "held", Units: 1, Mode: driver.ModeReport, Epoch: epoch, Keys: []string{"k"}, Limits: []int{1}}}})
			require.NoError(t, err)
			assert.Equal(t, []driver.Fate{driver.FateRenewed}, res.Leases, "the holder's renewal")
		})
	}
}

// A grant that lapsed before a silence began is not brought back by the
// grace: its waiter's late claim queues again, as without the silence.
// (The claim's shortcut took the grace's end for the key's earliest
// expiry, and admitted it.)
func TestGrantLapsedBeforeASilence(t *testing.T) {
	for _, silence := range []bool{false, true} {
		m := redistest.StartMini(t)
		s := redisstore.New(m.Client(), "t")
		step := func(d time.Duration) { m.Advance(d); m.Srv.FastForward(d) }
		var epoch int64
		require.Equal(t, driver.StatusAdmitted, silenceCall(t, s, &epoch, "h", "k", false).Status)
		require.Equal(t, driver.StatusQueued, silenceCall(t, s, &epoch, "w1", "k", true).Status)
		require.Equal(t, driver.StatusQueued, silenceCall(t, s, &epoch, "w2", "k", true).Status)
		require.NoError(t, s.Release(context.Background(), &driver.ReleaseCall{TTL: time.Second, Claim: 100 * time.Millisecond,
			Pairs: []driver.Release{{Key: "k", Lease: "h", Limit: 1}}}))
		require.Equal(t, []string{"w1"}, m.Leases("t", "k"), "w1 granted")
		step(200 * time.Millisecond) // w1's grant lapses
		require.Equal(t, driver.StatusAdmitted, silenceCall(t, s, &epoch, "other", "j", false).Status, "the store hears a call")
		if silence {
			step(600 * time.Millisecond) // more than half the TTL
		} else {
			step(50 * time.Millisecond)
		}
		assert.Equal(t, driver.StatusQueued, silenceCall(t, s, &epoch, "w1", "k", true).Status, "silence %v: w1's late claim", silence)
	}
}

// silenceStores is a Redis (on miniredis) and a memstore, each with a
// clock the test moves on.
func silenceStores(t *testing.T) []struct {
	name    string
	s       driver.Store
	advance func(time.Duration)
} {
	m := redistest.StartMini(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return []struct {
		name    string
		s       driver.Store
		advance func(time.Duration)
	}{
		{"redis", redisstore.New(m.Client(), "t"), func(d time.Duration) { m.Advance(d); m.Srv.FastForward(d) }},
		{"memstore", memstore.NewWithClock(func() time.Time { return now }), func(d time.Duration) { now = now.Add(d) }},
	}
}

// A silence of more than five minutes (the bound on graces that follow
// one another) holds the holder's lease for every call of its grace, not
// only for the one that found it. With a TTL of a minute: the key of
// leases outlives its latest lease by five minutes.
func TestSilenceOfMoreThanFiveMinutes(t *testing.T) {
	for _, st := range silenceStores(t) {
		t.Run(st.name, func(t *testing.T) {
			var epoch int64
			call := func(lease string) driver.Status {
				t.Helper()
				res, err := st.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{1}, Units: 1,
					TTL: time.Minute, Claim: time.Second, Live: time.Hour, Weight: 1, Proc: "p-" + lease, MaxQueue: -1, MaxFlowQueue: -1, Epoch: epoch})
				require.NoError(t, err)
				epoch = res.Epoch
				return res.Status
			}
			require.Equal(t, driver.StatusAdmitted, call("held"))
			st.advance(5*time.Minute + 10*time.Second)
			assert.Equal(t, driver.StatusFull, call("x"), "the call that finds the silence")
			st.advance(time.Second)
			assert.Equal(t, driver.StatusFull, call("y"), "the next call")
		})
	}
}

// Graces that follow one another (the only calls 0.7 TTL apart, from
// processes that never renew: a dead holder's lease and nobody else
// heard) hold a lease five minutes at most: then it expires.
func TestGracesInARowEnd(t *testing.T) {
	for _, st := range silenceStores(t) {
		t.Run(st.name, func(t *testing.T) {
			var epoch int64
			require.Equal(t, driver.StatusAdmitted, silenceCall(t, st.s, &epoch, "dead", "k", false).Status)
			var took time.Duration
			for i := 1; i <= 600; i++ {
				st.advance(700 * time.Millisecond)
				if silenceCall(t, st.s, &epoch, fmt.Sprint("x", i), "k", false).Status == driver.StatusAdmitted {
					took = time.Duration(i) * 700 * time.Millisecond
					break
				}
			}
			t.Logf("the dead lease expired %v after it was taken", took)
			require.NotZero(t, took, "held for 7 minutes")
			assert.Greater(t, took, 4*time.Minute, "held while the graces follow one another")
			assert.LessOrEqual(t, took, 5*time.Minute+2*time.Second, "five minutes at most, and a TTL")
		})
	}
}

// A holder that renewed in a grace whose silences began more than five
// minutes ago is held by the next silence all the same: the bound ends
// the leases that graces moved and nobody renewed, not a live holder's.
// (Past the bound, memstore held no lease, and a newcomer was admitted
// over the holder.)
func TestRenewedHolderAfterALongGrace(t *testing.T) {
	for _, st := range silenceStores(t) {
		t.Run(st.name, func(t *testing.T) {
			var epoch int64
			call := func(lease string) driver.Status {
				t.Helper()
				res, err := st.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{1}, Units: 1,
					TTL: time.Minute, Claim: time.Second, Live: time.Hour, Weight: 1, Proc: "p-" + lease, MaxQueue: -1, MaxFlowQueue: -1, Epoch: epoch})
				require.NoError(t, err)
				epoch = res.Epoch
				return res.Status
			}
			renew := func() driver.Fate {
				t.Helper()
				res, err := st.s.Renew(context.Background(), &driver.RenewCall{TTL: time.Minute, Epoch: epoch, Leases: []driver.Renewal{
					{Lease: "held", Units: 1, Mode: driver.ModeReport, Epoch: epoch, Keys: []string{"k"}, Limits: []int{1}}}})
				require.NoError(t, err)
				return res.Leases[0]
			}
			require.Equal(t, driver.StatusAdmitted, call("held"))
			st.advance(5*time.Minute + 10*time.Second) // a long hang
			assert.Equal(t, driver.StatusFull, call("x"), "after the long hang")
			st.advance(time.Second)
			require.Equal(t, driver.FateRenewed, renew(), "the holder renews in the grace")
			st.advance(90 * time.Second) // a second hang, past the holder's TTL
			assert.Equal(t, driver.StatusFull, call("y"), "after the second hang")
			assert.Equal(t, driver.FateRenewed, renew(), "the holder's renewal")
		})
	}
}
