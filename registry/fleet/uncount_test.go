package fleet

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/slots"
)

// releaseHold holds the release script's calls while armed, counting them.
type releaseHold struct {
	armed atomic.Bool
	held  atomic.Int32
	open  chan struct{}
}

func (h *releaseHold) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *releaseHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); h.armed.Load() && len(a) > 1 && isRelease(cmd.Name(), fmt.Sprint(a[1])) {
			h.held.Add(1)
			<-h.open
		}
		return next(ctx, cmd)
	}
}
func (h *releaseHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func isRelease(name, arg string) bool {
	switch name {
	case "evalsha":
		return arg == releaseScript.Hash()
	case "eval":
		sum := sha1.Sum([]byte(arg))
		return hex.EncodeToString(sum[:]) == releaseScript.Hash()
	}
	return false
}

// startOf returns what Redis told of s's admission.
func startOf(s *slots.Slot) start {
	return (*core.Handle)(s).Hold().Owner.(*lease[string]).start
}

// An admission's count on a learned key leaves out this process's leases
// whose holders were done before its call and whose removal has not been
// sent: Redis still counts them, the upstream no longer has them. A
// removal on its way (it may have run first) stays counted.
func TestAdmissionCountLeavesOutReleasesNotSent(t *testing.T) {
	srv := fleettest.Start(t)
	c := srv.Client()
	h := &releaseHold{open: make(chan struct{})}
	c.AddHook(h)
	r := New[string](c, "le-uncount", 100, WithLogger(quiet()))
	defer r.Close()
	defer close(h.open) // before Close: its removals go out
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 20}))
	var held []*slots.Slot
	for i := range 5 {
		s, err := r.TryAcquire("p")
		require.NoError(t, err)
		assert.Equal(t, []int64{int64(i + 1)}, startOf(s).counts, "nothing released: Redis's count")
		held = append(held, s)
	}

	h.armed.Store(true)
	held[0].Release() // its removal goes out, and is held on its way
	fwUntil(t, "the first removal on its way", func() bool { return h.held.Load() == 1 })
	held[1].Release()
	held[2].Release() // these two wait behind it, not sent
	fwUntil(t, "two removals queued", func() bool {
		r.remMu.Lock()
		defer r.remMu.Unlock()
		return len(r.removals) == 2
	})
	s, err := r.TryAcquire("p")
	require.NoError(t, err)
	n, err := r.InFlight(context.Background(), "p")
	require.NoError(t, err)
	assert.Equal(t, 6, n, "Redis counts every lease not removed yet")
	assert.Equal(t, []int64{4}, startOf(s).counts, "the two removals not sent are left out; the one on its way is not")
}

// uncount leaves counted what may not be in Redis's count, or may have
// left it: a removal tried once, an abandon, one queued after the call, one
// queued a third of a TTL ago; and it keeps each count at least 1.
func TestUncountLeavesCountedWhatItCannotBeSureOf(t *testing.T) {
	srv := fleettest.Start(t)
	r := New[string](srv.Client(), "le-uncount-edges", 100, WithLogger(quiet()), WithLeaseTTL(3*time.Second))
	defer r.Close()
	made := time.Now()
	before := made.Add(-time.Millisecond)
	r.remMu.Lock()
	r.removals = []*lease[string]{
		{keys: []string{"p"}, since: before},                                    // left out
		{keys: []string{"p", "q"}, since: before},                               // left out, from both
		{keys: []string{"q"}, since: before},                                    // another key
		{keys: []string{"p"}, since: before, tried: true},                       // may have run
		{keys: []string{"p"}, since: before, abandoned: true},                   // may not be there
		{keys: []string{"p"}, since: made},                                      // not before the call
		{keys: []string{"p"}, since: made.Add(-time.Second - time.Millisecond)}, // may have expired
	}
	r.remMu.Unlock()
	counts := []int64{10, 10}
	r.uncount(made, []string{"p", "q"}, counts)
	assert.Equal(t, []int64{8, 8}, counts)
	counts = []int64{2, 1}
	r.uncount(made, []string{"p", "q"}, counts)
	assert.Equal(t, []int64{1, 1}, counts, "the admission's own lease stays counted")
	r.remMu.Lock()
	r.removals = nil // none of them was a real lease
	r.remMu.Unlock()
}
