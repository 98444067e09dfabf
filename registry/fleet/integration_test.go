package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// fakeUpstream is a fake provider that counts the requests it serves at once,
// on its own, and holds each for a moment.
type fakeUpstream struct {
	cur, peak, served atomic.Int64
	hold              time.Duration
}

func (u *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.cur.Add(1)
	defer u.cur.Add(-1)
	for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
	}
	time.Sleep(u.hold) // the request's own work upstream
	u.served.Add(1)
	io.WriteString(w, "ok")
}

// callThrough sends n requests to url through a Transport admitted by
// acquire, and returns how many failed.
func callThrough(url string, n int, acquire func(context.Context) (*slots.Slot, error)) int {
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) {
		return acquire(r.Context())
	})}
	failed := 0
	for range n {
		resp, err := client.Get(url)
		if err != nil {
			failed++
			continue
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
		}
	}
	return failed
}

// Three replicas, each its own Registry and client, share one cap of 8 on a
// provider (and 3 per model) under 64 concurrent workers: the fake
// upstream never sees more than 8 at once, and every request completes.
func TestFleetThreeReplicas(t *testing.T) {
	srv := redistest.Start(t)
	up := &fakeUpstream{hold: 2 * time.Millisecond}
	hs := httptest.NewServer(up)
	defer hs.Close()
	var replicas []*Registry[string]
	for range 3 {
		r := New[string](redisstore.New(srv.Client(), "providers"), 3)
		r.SetLimit("zai", 8)
		t.Cleanup(r.Close)
		replicas = append(replicas, r)
	}
	var modelCur [3]atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 64 {
		r := replicas[w%3]
		model := fmt.Sprint("zai/m", w%3)
		wg.Go(func() {
			failed.Add(int64(callThrough(hs.URL, 15, func(ctx context.Context) (*slots.Slot, error) {
				s, err := r.AcquireAll(ctx, "zai", model)
				if err == nil {
					if n := modelCur[w%3].Add(1); n > 3 {
						t.Errorf("model %s: %d in flight over its cap of 3", model, n)
					}
					modelCur[w%3].Add(-1)
				}
				return s, err
			})))
		})
	}
	wg.Wait()
	assert.Zero(t, failed.Load())
	assert.Equal(t, int64(64*15), up.served.Load())
	assert.LessOrEqual(t, up.peak.Load(), int64(8), "fleet-wide in flight at the upstream")
	assert.GreaterOrEqual(t, up.peak.Load(), int64(6), "the cap is used, not just respected")
	for _, r := range replicas {
		require.Eventually(t, func() bool { return r.Stats().Held == 0 }, 5*time.Second, time.Millisecond)
	}
	n, err := replicas[0].InFlight(context.Background(), "zai")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n, err = replicas[0].InFlight(context.Background(), "zai")
		return err == nil && n == 0
	}, 5*time.Second, time.Millisecond, "every lease removed")
}

// Three processes (this test binary, run again) share a cap of 8 under 64
// workers in all; the fake upstream here counts what reaches it.
func TestFleetThreeProcesses(t *testing.T) {
	if os.Getenv("FLEET_CHILD") != "" {
		t.Skip("in a child process")
	}
	srv := redistest.Start(t)
	up := &fakeUpstream{hold: 3 * time.Millisecond}
	hs := httptest.NewServer(up)
	defer hs.Close()
	var wg sync.WaitGroup
	out := make([][]byte, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestFleetChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "FLEET_CHILD=1", "FLEET_REDIS="+srv.Addr, "FLEET_UPSTREAM="+hs.URL,
				"FLEET_WORKERS="+strconv.Itoa(21+i/2), "FLEET_REQUESTS=12")
			out[i], errs[i] = cmd.CombinedOutput()
		})
	}
	wg.Wait()
	for i := range 3 {
		require.NoError(t, errs[i], "child %d:\n%s", i, out[i])
	}
	assert.Equal(t, int64(64*12), up.served.Load(), "all work completes")
	assert.LessOrEqual(t, up.peak.Load(), int64(8), "fleet-wide in flight at the upstream")
	assert.GreaterOrEqual(t, up.peak.Load(), int64(6), "the cap is used")
}

// TestFleetChild is one process of TestFleetThreeProcesses.
func TestFleetChild(t *testing.T) {
	if os.Getenv("FLEET_CHILD") == "" {
		t.Skip("run by TestFleetThreeProcesses")
	}
	workers, _ := strconv.Atoi(os.Getenv("FLEET_WORKERS"))
	requests, _ := strconv.Atoi(os.Getenv("FLEET_REQUESTS"))
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("FLEET_REDIS"), PoolSize: 64})
	defer c.Close()
	r := New[string](redisstore.New(c, "providers"), 8)
	defer r.Close()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range workers {
		wg.Go(func() {
			failed.Add(int64(callThrough(os.Getenv("FLEET_UPSTREAM"), requests, func(ctx context.Context) (*slots.Slot, error) {
				return r.Acquire(ctx, "zai")
			})))
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load())
	require.Eventually(t, func() bool { return r.Stats().Held == 0 }, 5*time.Second, time.Millisecond)
}

// Redis is killed while slots are held, and restarted empty: no holder
// loses its slot; while it is down a FallbackLocal registry admits under
// its local cap (Degraded) and a FailClosed one refuses; once it is back the
// breaker closes, every held lease is put back, and fleet admission resumes
// once the renewal round that new admissions wait for after the loss of
// Redis's data has passed. How soon (about a second, unloaded) depends on
// the machine: the times are logged, and bounded only so that the test
// fails rather than hangs.
func TestFleetRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	opts := []Option{WithLeaseTTL(time.Second), WithBreaker(2, 50*time.Millisecond), WithTimeout(100 * time.Millisecond)}
	local := New[string](redisstore.New(srv.Client(), "p"), 4, opts...)
	defer local.Close()
	closed := New[string](redisstore.New(srv.Client(), "p"), 4, append(opts, WithUnavailable(FailClosed))...)
	defer closed.Close()

	var held []*slots.Slot
	for _, r := range []*Registry[string]{local, local, closed} {
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		held = append(held, s)
	}
	srv.Kill()
	for _, s := range held {
		assert.False(t, s.Released(), "a holder keeps its slot")
	}
	// local holds 2 of its local cap of 4: 2 more, degraded.
	for range 2 {
		s, err := local.TryAcquire("k")
		require.NoError(t, err)
		assert.True(t, s.Degraded())
		held = append(held, s)
	}
	_, err := local.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the local cap holds")
	_, err = closed.TryAcquire("k")
	assert.ErrorIs(t, err, ErrUnavailable)

	restarted := time.Now()
	srv.Restart()
	require.Eventually(t, func() bool {
		return !local.Stats().BreakerOpen && !closed.Stats().BreakerOpen
	}, 10*time.Second, time.Millisecond)
	t.Logf("breakers closed %v after the restart", time.Since(restarted).Round(time.Millisecond))
	// The next renewal (every TTL/3) puts back the three leases Redis lost;
	// the two degraded ones went back when the breaker closed.
	require.Eventually(t, func() bool {
		n, err := local.InFlight(context.Background(), "k")
		return err == nil && n == 5
	}, 10*time.Second, time.Millisecond, "all five held leases are in Redis again")
	t.Logf("the held leases back in Redis %v after the restart", time.Since(restarted).Round(time.Millisecond))
	_, err = closed.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the fleet counts the reasserted leases")

	for _, s := range held {
		s.Release()
	}
	require.Eventually(t, func() bool {
		n, err := local.InFlight(context.Background(), "k")
		return err == nil && n == 0
	}, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := closed.Acquire(ctx, "k")
	require.NoError(t, err, "admission resumes")
	t.Logf("admission resumed %v after the restart", time.Since(restarted).Round(time.Millisecond))
	s.Release()
}

// A holder that stops renewing has its lease reclaimed after the TTL, and
// not before.
func TestFleetDeadHolderRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	dead := New[string](redisstore.New(srv.Client(), "p"), 1, WithLeaseTTL(300*time.Millisecond))
	_, err := dead.TryAcquire("k")
	require.NoError(t, err)
	dead.Close() // a crash: no release, no renewal
	died := time.Now()

	live := New[string](redisstore.New(srv.Client(), "p"), 1, WithLeaseTTL(300*time.Millisecond))
	defer live.Close()
	_, err = live.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := live.Acquire(ctx, "k")
	require.NoError(t, err, "the dead holder's lease is reclaimed")
	waited := time.Since(died)
	t.Logf("admitted %v after the holder died (lease TTL 300 ms)", waited.Round(time.Millisecond))
	assert.GreaterOrEqual(t, waited, 250*time.Millisecond, "not before the lease expired")
	s.Release()
}
