package fleet

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// A learned state in a later format (a later release's, during a rolling
// deploy; its "f" a number over 1, or anything but a whole number) is
// neither read nor written over: the process goes on with its own cap and
// says why, and the state stays as the later release wrote it. A message
// of one, of this fleet's epoch and a cap this release could read, is not
// taken either.
func TestLearnedStateOfALaterFormatLeftAlone(t *testing.T) {
	for _, f := range []string{`2`, `"2"`, `2.5`} {
		t.Run("f="+f, func(t *testing.T) { laterFormatLeftAlone(t, f) })
	}
}

func laterFormatLeftAlone(t *testing.T, f string) {
	ctx := context.Background()
	ms := memstore.New()
	var logged logs
	r := New[string](ms, 100, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	defer r.Close()
	require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 10}))
	settled(t, r, "p")
	res, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, res.Found)
	var st storedCap
	require.NoError(t, json.Unmarshal([]byte(res.State), &st))

	// A message of this epoch, whose cap reads as this release's.
	s, err := r.TryAcquire("p") // tells the epoch
	require.NoError(t, err)
	require.NotZero(t, r.epoch.Load())
	msg := st
	msg.V, msg.E, msg.Cap.Lo = st.V+1000, r.epoch.Load(), 50
	b, err := json.Marshal(msg)
	require.NoError(t, err)
	r.learnedMessage(strings.Replace(string(b), `"f":1`, `"f":`+f, 1))
	assert.Equal(t, 10, r.Learned("p").Cap, "the message not taken")

	later := `{"k":"p","v":` + res.Version + `9,"f":` + f + `,"cap":{"limit":{"requests":3,"tokens":4096}}}`
	w, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", Presumed: res.Version, State: later, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, w.Wrote)
	r.Report(s, pacing.Verdict{Kind: pacing.Concurrency}) // at 1 in flight: the cap is cut to 1
	s.Release()
	r.flushLearned("p")
	assert.Equal(t, 1, r.Learned("p").Cap, "its own evidence, on its own cap")
	fwUntil(t, "the reason logged", func() bool { return strings.Contains(logged.String(), "as a later release wrote it") })
	now, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", TTL: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, later, now.State, "left as the later release wrote it")
}
