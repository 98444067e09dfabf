package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// The scripts alone, on a miniredis whose clock the test sets: the
// epoch, the pause, carried leases, idempotence, and calls that come too
// late.

// mini is a miniredis with its clock set (redistest.Mini), for fleets
// named "t".
type mini struct{ *redistest.Mini }

func newMini(t *testing.T) *mini { return &mini{redistest.StartMini(t)} }

func (m *mini) advance(d time.Duration) { m.Advance(d) }

func (m *mini) client() *redis.Client { return m.Client() }

func (m *mini) leases(key string) []string { return m.Leases("t", key) }

// runAcquire runs the acquire script for a caller that does not wait,
// with keys and args as the script takes them less the queue's: keys
// (epoch, pause, tombstone, capped keys, carried pairs) get the name's
// #procs key after the tombstone, and args (id, ttl, n, not-after, known
// epoch, pause, limits, carried ids and units) the queue's arguments and
// the lease's units (1) after the pause.
func runAcquire(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	procs := strings.TrimSuffix(keys[0], "#epoch") + "#procs"
	keys = slices.Insert(slices.Clone(keys), 3, procs)
	args = slices.Insert(slices.Clone(args), 6, 0, 1000, 0, "", 1, "test", "wake:", -1, -1, 3000, 1)
	heard := strings.TrimSuffix(keys[0], "#epoch") + "#heard"
	return acquireScript.Run(ctx, c, append(keys, heard), args...)
}

// The script is idempotent per lease id: a retried call holds one lease.
func TestAcquireScriptIdempotent(t *testing.T) {
	m := newMini(t)
	c := m.client()
	ctx := context.Background()
	keys := func(id string) []string {
		return []string{"inflight:{t}#epoch", "inflight:{t}#pause", "inflight:{t}:abandoned:" + id, "inflight:{t}:p", "inflight:{t}:m"}
	}
	for range 3 {
		res, err := runAcquire(ctx, c, keys("lease-1"), "lease-1", 3000, 2, 0, 0, 0, 1, 1).Int64Slice()
		require.NoError(t, err)
		assert.Equal(t, int64(1), res[0], "the same lease is admitted again, not refused")
	}
	res, err := runAcquire(ctx, c, keys("lease-2"), "lease-2", 3000, 2, 0, 0, 0, 1, 1).Int64Slice()
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 1, 1}, res[:3], "another lease is refused: key 1 is full with 1")
	assert.Equal(t, []string{"lease-1"}, m.leases("p"))
}

// The acquire script puts in the leases it carries (admitted while Redis
// was unreachable) before it decides, so that they count against this
// admission; not one whose tombstone exists (released meanwhile).
func TestAcquireScriptCarries(t *testing.T) {
	m := newMini(t)
	c := m.client()
	ctx := context.Background()
	const epoch, tomb = "inflight:{t}#epoch", "inflight:{t}:abandoned:"
	m.Srv.Set(tomb+"released", "1")
	keys := []string{epoch, "inflight:{t}#pause", tomb + "new", "inflight:{t}:k",
		"inflight:{t}:k", tomb + "degraded", "inflight:{t}:k", tomb + "released"}
	res, err := runAcquire(ctx, c, keys, "new", 3000, 1, 0, 0, 0, 2, "degraded", 1, "released", 1).Int64Slice()
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 0, 0}, res[:3], "admitted: the carried lease and this one fill the cap of 2")
	assert.ElementsMatch(t, []string{"degraded", "new"}, m.leases("k"))
	res, err = runAcquire(ctx, c, keys[:4], "another", 3000, 1, 0, 0, 0, 2).Int64Slice()
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 1, 2}, res[:3], "full")
	e, err := m.Srv.Get(epoch)
	require.NoError(t, err)
	assert.Equal(t, e, fmt.Sprint(res[5]), "the epoch is set, and returned")
}

// The scripts: the pause is declared once per epoch, by a caller that saw
// another epoch; a second loss inside the pause starts a new one from its
// own epoch's birth; a pause is honoured at most a TTL (the caller's) from
// the epoch's birth, whatever the key says; a renewal that would put a
// lease back only if there is room (one that expired, or was lost before)
// counts as a new admission, and waits too.
func TestPauseScripts(t *testing.T) {
	m := newMini(t)
	c := m.client()
	ctx := context.Background()
	const epochKey, pauseKey, key = "inflight:{t}#epoch", "inflight:{t}#pause", "inflight:{t}:k"
	acquire := func(id string, known int64, pause, ttl int64) []int64 {
		t.Helper()
		res, err := runAcquire(ctx, c, []string{epochKey, pauseKey, "inflight:{t}:abandoned:" + id, key},
			id, ttl, 1, 0, known, pause, 5).Int64Slice()
		require.NoError(t, err)
		requireReply(t, res, 1)
		return res
	}
	renew := func(id string, mode int, leaseEpoch, known int64) int64 {
		t.Helper()
		res, err := renewScript.Run(ctx, c, []string{epochKey, pauseKey, key, "inflight:{t}:abandoned:" + id, "inflight:{t}#heard"},
			60000, 0, known, 2000, id, mode, leaseEpoch, 1, 1, 5).Int64Slice()
		require.NoError(t, err)
		require.Len(t, res, 3)
		return res[2]
	}
	ms := func(d time.Duration) int64 { return m.Now.Add(d).UnixMilli() }

	res := acquire("a", 0, 2000, 60000)
	require.Equal(t, int64(1), res[0])
	e1 := res[5]
	m.Srv.FlushAll()
	m.advance(time.Second)
	res = acquire("b", e1, 2000, 60000)
	assert.Equal(t, []int64{acquirePaused, 0, 0, ms(2 * time.Second)}, res[:4], "declared: paused until birth + 2 s")
	e2 := res[5]
	assert.NotEqual(t, e1, e2)
	res = acquire("b", e1, 9000, 60000)
	assert.Equal(t, ms(2*time.Second), res[3], "declared once: a later caller does not move it")
	assert.Equal(t, int64(leasePutBack), renew("a", reassert, e1, e1), "a lease Redis lost goes back without a check")
	assert.Equal(t, int64(leaseGone), renew("x", reassert, 0, e2), "one lost before would be a new admission: it waits")
	assert.Equal(t, int64(leaseGone), renew("y", reassert, e2, e2), "as one that expired")

	m.advance(time.Second)
	m.Srv.FlushAll() // a second loss inside the pause
	res = acquire("c", e2, 2000, 60000)
	assert.Equal(t, []int64{acquirePaused, ms(2 * time.Second)}, []int64{res[0], res[3]}, "a new pause from the new birth")
	e3 := res[5]
	m.advance(2 * time.Second)
	res = acquire("c", e3, 2000, 60000)
	assert.Equal(t, int64(1), res[0], "over")
	assert.Equal(t, int64(leaseRoom), renew("x", reassert, 0, e3), "after the pause, with room")

	m.Srv.Set(pauseKey, strconv.FormatInt(ms(4*time.Minute), 10)) // past the TTL, within 5 minutes
	res = acquire("d", e3, 2000, 3000)
	assert.Equal(t, int64(acquirePaused), res[0], "honoured: another process's TTL may be longer")
	m.Srv.Set(pauseKey, strconv.FormatInt(ms(time.Hour), 10)) // far ahead
	res = acquire("d", e3, 2000, 3000)
	assert.Equal(t, int64(1), res[0], "not honoured at all")
	require.True(t, m.Srv.Del(pauseKey))

	m.Srv.FlushAll()
	res = acquire("e", e3, 0, 60000)
	assert.Equal(t, int64(1), res[0], "a caller that declares no pause")
	assert.False(t, m.Srv.Exists(pauseKey))
}

// The acquire and renew scripts refuse to run past their not-after time,
// and change nothing then: no lease, no epoch.
func TestScriptsRefuseToRunLate(t *testing.T) {
	m := newMini(t)
	c := m.client()
	ctx := context.Background()
	late := m.Now.UnixMilli() - 1
	res, err := runAcquire(ctx, c, []string{"inflight:{t}#epoch", "inflight:{t}#pause", "inflight:{t}:abandoned:x", "inflight:{t}:k",
		"inflight:{t}:k", "inflight:{t}:abandoned:y"}, "x", 3000, 1, late, 1, 1000, 1, "y").Int64Slice()
	require.NoError(t, err)
	assert.Equal(t, []int64{tooLate, m.Now.UnixMilli()}, []int64{res[0], res[4]})
	res, err = renewScript.Run(ctx, c, []string{"inflight:{t}#epoch", "inflight:{t}#pause", "inflight:{t}:k", "inflight:{t}:abandoned:x", "inflight:{t}#heard"},
		3000, late, 1, 1000, "x", putBack, 0, 1, 1, 1).Int64Slice()
	require.NoError(t, err)
	assert.Equal(t, []int64{tooLate, m.Now.UnixMilli()}, res)
	assert.Empty(t, m.Srv.Keys(), "nothing written")
}
