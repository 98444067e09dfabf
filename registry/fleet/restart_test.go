package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// provider counts the requests in flight at it, apart from anything the
// library reports: a holder starts its request once admitted and ends it
// before it releases.
type provider struct {
	limit int

	mu     sync.Mutex // protects the fields below
	cur    int
	peak   int
	over   int         // starts that found more than limit in flight
	starts []time.Time // of every request
	counts []int       // in flight at each start
}

func (p *provider) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur++
	p.peak = max(p.peak, p.cur)
	if p.cur > p.limit {
		p.over++
	}
	p.starts = append(p.starts, time.Now())
	p.counts = append(p.counts, p.cur)
}

func (p *provider) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur--
}

// since returns the requests started after t, and the first of them.
func (p *provider) since(t time.Time) (n int, first time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.starts {
		if s.After(t) {
			if n == 0 {
				first = s
			}
			n++
		}
	}
	return n, first
}

// startsSince returns when requests started after t, and with how many in
// flight.
func (p *provider) startsSince(t time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for i, s := range p.starts {
		if s.After(t) {
			out = append(out, fmt.Sprintf("%s (%d)", s.Format(time.StampMilli), p.counts[i]))
		}
	}
	return out
}

func (p *provider) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Redis is killed under full load, holders streaming and waiters queued on
// three replicas that share a cap of 5, and restarted empty. Its data is
// gone: the holders' leases with it. The first call after the restart from
// a replica that knew the old epoch finds the loss and pauses new
// admissions for one renewal round, during which every live holder's
// heartbeat puts its lease back: the provider never sees more than 5 at
// once. The replicas fail closed while Redis is down (admitting under the
// local registry alone is the documented exception), and their waiters
// keep waiting through the pause.
func TestRestartUnderLoadKeepsTheCap(t *testing.T) {
	srv := redistest.Start(t)
	const limit, replicas, workers = 5, 3, 12
	const ttl = time.Second // renewals every 333 ms
	up := &provider{limit: limit}
	logged := &testrig.Buffer{}
	var regs []*Registry[string]
	for i := range replicas {
		log := slog.New(slog.NewTextHandler(logged, nil)).With("replica", i)
		r := New[string](redisstore.New(srv.Client(), "restart"), limit, WithLeaseTTL(ttl), WithTimeout(100*time.Millisecond),
			WithBreaker(2, 50*time.Millisecond), WithUnavailable(FailClosed), WithLogger(log))
		t.Cleanup(r.Close)
		regs = append(regs, r)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for w := range workers {
		r := regs[w%replicas]
		wg.Go(func() {
			for ctx.Err() == nil {
				s, err := r.Acquire(ctx, "zai")
				switch {
				case errors.Is(err, ErrUnavailable):
					// Redis is down: the caller tries again shortly.
					select {
					case <-ctx.Done():
					case <-time.After(5 * time.Millisecond):
					}
					continue
				case ctx.Err() != nil:
					if err == nil {
						s.Release()
					}
					return
				case err != nil:
					t.Errorf("acquire: %v", err)
					return
				}
				up.start()
				// A streamed response, longer than a renewal round: holders
				// hold through the restart.
				time.Sleep(300*time.Millisecond + rand.N(600*time.Millisecond))
				up.end()
				s.Release()
			}
		})
	}
	waiting := func() int {
		n := 0
		for _, r := range regs {
			n += r.Stats().Waiting
		}
		return n
	}
	// Every replica has heard from Redis, as every process of a running
	// fleet has: one whose first calls are still on their way at the kill
	// cannot tell the loss from a first start (see Lost leases), and what
	// it admits before the others call is not held back.
	knows := func() bool {
		for _, r := range regs {
			if r.epoch.Load() == 0 {
				return false
			}
		}
		return true
	}
	require.Eventually(t, func() bool { return up.inFlight() == limit && waiting() > 0 && knows() },
		10*time.Second, time.Millisecond, "the cap full, waiters queued, every replica has heard from Redis")

	killed := time.Now()
	srv.Kill()
	srv.Restart()
	restarted := time.Now()
	defer func() {
		if t.Failed() {
			t.Logf("killed at %s, restarted at %s; starts since: %v\nthe replicas' logs:\n%s",
				killed.Format(time.StampMilli), restarted.Format(time.StampMilli), up.startsSince(killed), logged)
		}
	}()
	require.Eventually(t, func() bool { n, _ := up.since(restarted); return n >= 3*limit },
		20*time.Second, time.Millisecond, "admissions go on after the restart")
	stop()
	wg.Wait()

	_, first := up.since(restarted)
	resumed := first.Sub(restarted)
	t.Logf("over-cap starts: %d (peak %d for a cap of %d); first admission %v after the restart (Redis down %v)",
		up.over, up.peak, limit, resumed.Round(time.Millisecond), restarted.Sub(killed).Round(time.Millisecond))
	assert.Zero(t, up.over, "requests started over the cap (peak %d)", up.peak)
	assert.Less(t, resumed, ttl, "admissions resume within about one renewal round")
	var paused, lost, reasserted uint64
	for _, r := range regs {
		st := r.Stats()
		paused, lost, reasserted = paused+st.Paused, lost+st.Lost, reasserted+st.Reasserted
	}
	t.Logf("paused tries %d; leases lost with the data %d, put back %d", paused, lost, reasserted)
	assert.NotZero(t, paused, "waiters waited through the pause")
	assert.Equal(t, lost, reasserted, "every lease Redis lost went back")
	for _, r := range regs {
		require.Eventually(t, func() bool {
			n, err := r.InFlight(context.Background(), "zai")
			return err == nil && n == 0 && r.Stats().Held == 0
		}, 10*time.Second, time.Millisecond, "every lease removed")
	}
}
