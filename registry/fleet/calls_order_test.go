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

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/stretchr/testify/assert"
)

// orderStore plays the store for admission calls made directly through
// r.call: a call's Lease is "o:<seq>" (ordered), "u:<seq>" or "c:..." (a
// claim). It records, per key, the order ordered calls executed in, and
// any two groups (a call alone or a batch) in flight at once that share a
// key with an ordered call each; it counts the pipelines of claims. It
// pipelines as Redis does (driver.Pipeliner), so that claims share them.
// Its other operations are the embedded store's.
type orderStore struct {
	driver.Store
	mu           sync.Mutex
	inflight     map[string]int
	exec         map[string][]int
	overlaps     []string
	maxDelay     time.Duration
	panicPct     int
	execd        atomic.Int64
	claimBatches atomic.Int64
}

func (h *orderStore) Pipelines() bool { return true }

func (h *orderStore) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	res, _ := h.run(ctx, []*driver.AdmitCall{c}) // an error is the call's
	return res[0], res[0].Err
}

func (h *orderStore) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	return h.run(ctx, calls)
}

func parseCall(c *driver.AdmitCall) (ordered bool, seq int, keys []string) {
	seq, _ = strconv.Atoi(c.Lease[2:])
	return strings.HasPrefix(c.Lease, "o:"), seq, c.Keys
}

func (h *orderStore) run(ctx context.Context, cmds []*driver.AdmitCall) ([]driver.AdmitResult, error) {
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
	if len(cmds) > 1 && strings.HasPrefix(cmds[0].Lease, "c:") {
		h.claimBatches.Add(1)
	}
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
			// Each call fails on its own, as the Redis store's pipeline
			// reports it (and the calls' error, not the batch's).
			out := make([]driver.AdmitResult, len(cmds))
			for i := range out {
				out[i].Err = ctx.Err()
			}
			return out, nil
		}
	}
	if h.panicPct > 0 && rand.N(100) < h.panicPct {
		panic("hook panic")
	}
	out := make([]driver.AdmitResult, len(cmds))
	for i := range out {
		out[i] = driver.AdmitResult{Status: driver.StatusQueued, Key: 0, Epoch: 1}
	}
	return out, nil
}

// Ordered calls (waiters'), each made once the one before it is placed,
// on 1 to 3 of 5 keys, mixed with unordered ones (TryAcquire's) and with
// bursts of claims past the claims' lane's bound (so that claims share
// pipelines), some given up, some timed out, under a store that answers
// in up to 3 or 30 ms, or panics, or is closed midway: no two groups of
// calls (a call alone or a pipeline) in flight at once hold an ordered
// call on the same key, the ordered calls on each key run in the order
// they were made, every call returns, and both lanes end empty.
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
			h := &orderStore{Store: redisstore.New(m.client(), "t"), inflight: map[string]int{}, exec: map[string][]int{}, maxDelay: tc.maxDelay, panicPct: tc.panicPct}
			r := New[string](h, 5, WithLeaseTTL(3*time.Second), WithTimeout(20*time.Millisecond), WithBreaker(1_000_000, time.Second), WithLogger(quiet()))
			t.Cleanup(r.Close)
			allKeys := []string{"a", "b", "c", "d", "e"}
			pick := func() []string {
				n := 1 + rand.N(3)
				perm := rand.Perm(len(allKeys))[:n]
				var ks []string
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
			doCall := func(ctx context.Context, keys []string, id string, placed func(), claim bool) {
				defer func() { _ = recover() }()
				capped := keys
				limits := make([]int, len(capped))
				for i := range limits {
					limits[i] = 1
				}
				ac := &driver.AdmitCall{Lease: id, Keys: capped, Limits: limits, TTL: time.Millisecond, Weight: 1, MaxQueue: -1, MaxFlowQueue: -1}
				r.call(ctx, ac, 0, placed, claim)
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
							doCall(ctx, keys, "o:"+strconv.Itoa(s), func() { close(placed) }, false)
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
						doCall(ctx, pick(), "u:"+strconv.Itoa(i), nil, false)
						cancel()
					}
				})
			}
			// claims, in bursts of twice as many as go at once
			for g := 0; g < 2; g++ {
				wg.Go(func() {
					for i := 0; time.Now().Before(stop); i++ {
						var burst sync.WaitGroup
						for j := range 2 * maxClaiming {
							burst.Go(func() {
								// Half of them never give up: each must be answered.
								ctx, cancel := context.WithCancel(context.Background())
								if j%2 == 0 {
									ctx, cancel = context.WithTimeout(ctx, time.Duration(1+rand.N(30))*time.Millisecond)
								}
								defer cancel()
								pending.Add(1)
								defer pending.Add(-1)
								doCall(ctx, pick(), fmt.Sprintf("c:%d:%d:%d", g, i, j), nil, true)
							})
						}
						burst.Wait()
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
				pending, claiming, _ := r.pendingClaims()
				r.calls.mu.Lock()
				defer r.calls.mu.Unlock()
				return r.calls.sending == 0 && len(r.calls.pending) == 0 && r.calls.ordered == nil && pending == 0 && claiming == 0
			}, 5*time.Second, time.Millisecond, "both lanes drain")
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
			t.Logf("%d ordered calls made, %d calls run, %d ordered ones on key a, %d pipelines of claims", seq, h.execd.Load(), len(h.exec["a"]), h.claimBatches.Load())
			assert.Positive(t, len(h.exec["a"]), "ordered calls ran")
			assert.Positive(t, h.claimBatches.Load(), "claims shared pipelines")
		})
	}
}
