package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
)

// orderHook plays Redis for acquire calls made directly through r.call:
// args[0] is "o:<seq>" (ordered) or "u:<seq>". It records, per key, the
// order ordered calls executed in, and any two groups (an alone call or a
// pipeline) in flight at once that share a key with an ordered call each.
type orderHook struct {
	mu       sync.Mutex
	inflight map[string]int
	exec     map[string][]int
	overlaps []string
	maxDelay time.Duration
	panicPct int
	execd    atomic.Int64
}

func (h *orderHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *orderHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isAcquire(cmd) {
			return next(ctx, cmd)
		}
		return h.run(ctx, []redis.Cmder{cmd})
	}
}
func (h *orderHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !isAcquire(cmds[0]) {
			return next(ctx, cmds)
		}
		return h.run(ctx, cmds)
	}
}

func parseCall(cmd redis.Cmder) (ordered bool, seq int, capped []string) {
	a := cmd.Args()
	nk, _ := strconv.Atoi(fmt.Sprint(a[2]))
	keys := make([]string, 0, nk)
	for _, k := range a[3 : 3+nk] {
		keys = append(keys, fmt.Sprint(k))
	}
	id := fmt.Sprint(a[3+nk])
	seq, _ = strconv.Atoi(id[2:])
	return strings.HasPrefix(id, "o:"), seq, keys[acquireKeys:]
}

func (h *orderHook) run(ctx context.Context, cmds []redis.Cmder) error {
	group := map[string]bool{}
	h.mu.Lock()
	for _, c := range cmds {
		o, seq, capped := parseCall(c)
		if !o {
			continue
		}
		for _, k := range capped {
			if h.inflight[k] > 0 && !group[k] {
				h.overlaps = append(h.overlaps, fmt.Sprintf("seq %d on %s while another group has an ordered call on it", seq, k))
			}
			h.exec[k] = append(h.exec[k], seq)
		}
		for _, k := range capped {
			if !group[k] {
				group[k] = true
				h.inflight[k]++
			}
		}
	}
	h.mu.Unlock()
	h.execd.Add(int64(len(cmds)))
	defer func() {
		h.mu.Lock()
		for k := range group {
			h.inflight[k]--
		}
		h.mu.Unlock()
	}()
	if h.maxDelay > 0 {
		t := time.NewTimer(rand.N(h.maxDelay))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			for _, c := range cmds {
				c.SetErr(ctx.Err())
			}
			return ctx.Err()
		}
	}
	if h.panicPct > 0 && rand.N(100) < h.panicPct {
		panic("hook panic")
	}
	for _, c := range cmds {
		c.(*redis.Cmd).SetVal([]any{int64(acquireQueued), int64(1), int64(0), int64(0), int64(0), int64(1), int64(0)})
	}
	return nil
}

// Ordered calls (waiters'), each made once the one before it is placed,
// on 1 to 3 of 5 keys, mixed with unordered ones (TryAcquire's), some
// given up, some timed out, under a Redis (a client hook) that answers in
// up to 3 or 30 ms, or panics, or is closed midway: no two groups of
// calls (a call alone or a pipeline) in flight at once hold an ordered
// call on the same key, the ordered calls on each key run in the order
// they were made, every call returns, and the queue ends empty.
func TestOrderedCallsUnderStress(t *testing.T) {
	if testing.Short() {
		t.Skip("four runs of a second")
	}
	for _, tc := range []struct {
		name     string
		panicPct int
		close    bool
		maxDelay time.Duration
	}{
		{"plain", 0, false, 3 * time.Millisecond},
		{"timeouts", 0, false, 30 * time.Millisecond},
		{"panics", 5, false, 3 * time.Millisecond},
		{"close", 0, true, 5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMini(t)
			c := m.client()
			h := &orderHook{inflight: map[string]int{}, exec: map[string][]int{}, maxDelay: tc.maxDelay, panicPct: tc.panicPct}
			c.AddHook(h)
			r := New[string](c, "t", 5, WithLeaseTTL(3*time.Second), WithTimeout(20*time.Millisecond), WithBreaker(1_000_000, time.Second), WithLogger(quiet()))
			t.Cleanup(r.Close)
			allKeys := []string{"a", "b", "c", "d", "e"}
			pick := func() []string {
				n := 1 + rand.N(3)
				perm := rand.Perm(len(allKeys))[:n]
				ks := []string{"x0", "x1", "x2", "x3"}
				for _, i := range perm {
					ks = append(ks, allKeys[i])
				}
				return ks
			}
			var (
				seqMu   sync.Mutex
				seq     int
				wg      sync.WaitGroup
				pending atomic.Int64
				stop    = time.Now().Add(time.Second)
			)
			doCall := func(ctx context.Context, keys []string, id string, placed func()) {
				defer func() { _ = recover() }()
				capped := keys[acquireKeys:]
				limits := make([]int, len(capped))
				for i := range limits {
					limits[i] = 1
				}
				ac := &AdmitCall{Lease: id, Keys: capped, Limits: limits, TTL: time.Millisecond, Weight: 1, MaxQueue: -1, MaxFlowQueue: -1}
				r.call(ctx, ac, 0, placed)
			}
			// ordered callers, serialized by their placing (as waiters are)
			for g := 0; g < 8; g++ {
				wg.Go(func() {
					for time.Now().Before(stop) {
						seqMu.Lock()
						seq++
						s := seq
						keys := pick()
						ctx, cancel := context.WithCancel(context.Background())
						if rand.N(10) == 0 {
							ctx, cancel = context.WithTimeout(context.Background(), rand.N(10*time.Millisecond))
						}
						placed := make(chan struct{})
						done := make(chan struct{})
						pending.Add(1)
						go func() {
							defer close(done)
							defer pending.Add(-1)
							defer cancel()
							doCall(ctx, keys, "o:"+strconv.Itoa(s), func() { close(placed) })
						}()
						select {
						case <-placed:
						case <-done:
						}
						seqMu.Unlock()
						if rand.N(4) == 0 {
							<-done
						}
					}
				})
			}
			// unordered callers
			for g := 0; g < 4; g++ {
				wg.Go(func() {
					for i := 0; time.Now().Before(stop); i++ {
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rand.N(30))*time.Millisecond)
						doCall(ctx, pick(), "u:"+strconv.Itoa(i), nil)
						cancel()
					}
				})
			}
			if tc.close {
				<-time.After(500 * time.Millisecond) // Close while calls are under way
				r.Close()
			}
			waitDone := make(chan struct{})
			go func() { wg.Wait(); close(waitDone) }()
			select {
			case <-waitDone:
			case <-time.After(20 * time.Second):
				t.Fatalf("callers stuck; %d calls not returned", pending.Load())
			}
			ok := assert.Eventually(t, func() bool { return pending.Load() == 0 }, 10*time.Second, time.Millisecond, "calls return")
			if !ok {
				r.calls.mu.Lock()
				t.Logf("stranded: pending %d sending %d ordered %v", len(r.calls.pending), r.calls.sending, r.calls.ordered)
				r.calls.mu.Unlock()
			}
			assert.Eventually(t, func() bool {
				r.calls.mu.Lock()
				defer r.calls.mu.Unlock()
				return r.calls.sending == 0 && len(r.calls.pending) == 0 && r.calls.ordered == nil
			}, 5*time.Second, time.Millisecond, "queue drains")
			h.mu.Lock()
			defer h.mu.Unlock()
			assert.Empty(t, h.overlaps)
			for k, seqs := range h.exec {
				for i := 1; i < len(seqs); i++ {
					if seqs[i] < seqs[i-1] {
						t.Errorf("key %s: ordered call %d ran after %d", k, seqs[i], seqs[i-1])
						break
					}
				}
			}
			t.Logf("%d ordered calls made, %d calls run, %d ordered ones on key a", seq, h.execd.Load(), len(h.exec["inflight:{t}:a"]))
			assert.Positive(t, len(h.exec["inflight:{t}:a"]), "ordered calls ran")
		})
	}
}
