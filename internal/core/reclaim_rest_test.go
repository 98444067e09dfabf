package core_test

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
)

// A First that calls the rest of the reclaim twice frees the hold once.
func TestReclaimRestTwiceFreesOnce(t *testing.T) {
	o := &owner{}
	tr := &core.Tracked{Hold: core.Hold{Owner: o}}
	var done atomic.Int32
	first := func(rest func()) { rest(); rest(); done.Add(1) }
	tr.First.Store(&first)
	func() {
		type slot struct{ h core.Hold }
		core.AttachTo(tr, &slot{}, new(core.Hold))
	}()
	require.Eventually(t, func() bool { runtime.GC(); return done.Load() == 1 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int32(1), o.released.Load())
	assert.Zero(t, o.misused.Load())
}
