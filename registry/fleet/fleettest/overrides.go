package fleettest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// changes records the names an Overrides tells changed.
type changes struct {
	mu    sync.Mutex
	names []string
}

func (c *changes) add(name string) {
	c.mu.Lock()
	c.names = append(c.names, name)
	c.mu.Unlock()
}

func (c *changes) saw(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.names, name)
}

// overrides is one process's Overrides named name on the fleet "overrides",
// closed at t's cleanup.
func overrides(t *testing.T, srv Server, name string) (*fleet.Overrides, *changes) {
	t.Helper()
	c := &changes{}
	ov, err := fleet.NewOverrides(srv.Store(t, "overrides"), name, c.add, nil)
	require.NoError(t, err)
	t.Cleanup(ov.Close)
	return ov, c
}

// A limit set through one process's Overrides reaches the others (told to
// onChange), a process started later reads it, a Delete reaches them too;
// twenty changes made at once through two processes, on different names,
// are all kept (none lost to another's write); other overrides on the same
// store, and a learned cap beside them, do not meet these.
func overridesShared(t *testing.T, srv Server) {
	ctx := context.Background()
	a, _ := overrides(t, srv, "orgs")
	b, bSaw := overrides(t, srv, "orgs")
	learner := process(t, srv, "overrides", 100)
	require.NoError(t, learner.Learn("p", upstream.AdaptiveConfig{Initial: 10}))

	require.NoError(t, a.Set(ctx, "org-a", 1))
	n, ok := a.Get("org-a")
	assert.True(t, ok && n == 1, "the writer's copy holds its change at once")
	require.Eventually(t, func() bool { n, ok := b.Get("org-a"); return ok && n == 1 }, wait, 5*time.Millisecond, "the other process takes it")
	assert.Eventually(t, func() bool { return bSaw.saw("org-a") }, wait, 5*time.Millisecond, "and its onChange is told")

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			assert.NoError(t, []*fleet.Overrides{a, b}[i%2].Set(ctx, fmt.Sprint("n", i), i))
		})
	}
	wg.Wait()
	want := map[string]int{"org-a": 1}
	for i := range 20 {
		want[fmt.Sprint("n", i)] = i
	}
	require.NoError(t, a.Sync(ctx))
	assert.Equal(t, want, a.All(), "no change lost to another's write")
	assert.Eventually(t, func() bool { return fmt.Sprint(b.All()) == fmt.Sprint(want) }, wait, 5*time.Millisecond)

	late, _ := overrides(t, srv, "orgs")
	require.NoError(t, late.Sync(ctx))
	assert.True(t, late.Synced())
	assert.Equal(t, want, late.All(), "a process started later reads them")

	had, err := b.Delete(ctx, "org-a")
	require.NoError(t, err)
	assert.True(t, had)
	assert.Eventually(t, func() bool { _, ok := a.Get("org-a"); return !ok }, wait, 5*time.Millisecond, "the delete reaches the others")
	had, err = b.Delete(ctx, "org-a")
	require.NoError(t, err)
	assert.False(t, had, "nothing left to delete")

	require.NoError(t, a.Set(ctx, "unlimited", slots.Unlimited))
	for _, bad := range []struct {
		name string
		n    int
	}{{"org", -2}, {"", 1}, {"\xff", 1}} {
		assert.Error(t, a.Set(ctx, bad.name, bad.n), "%q %d", bad.name, bad.n)
	}

	other, _ := overrides(t, srv, "models")
	require.NoError(t, other.Sync(ctx))
	assert.Empty(t, other.All(), "other overrides on the same store are their own")
	assert.Equal(t, 10, learner.Learned("p").Cap, "a learned cap beside them is left as it was")
	_, err = fleet.NewOverrides(srv.Store(t, "overrides"), "", nil, nil)
	assert.Error(t, err, "a set needs a name")
}
