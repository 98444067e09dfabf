package fleet

import (
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/learn"
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

// goldenState is a learned state in format 1, every field of its cap set,
// as the release before the record of its own (capRecord) wrote it, from
// the learner's struct.
const goldenState = `{"k":"provider","v":42,"e":7,"f":1,"cap":{"floor":1,"ceil":64,"retest":10000000000,"lo":12,"hi":20,"hi_at":1700000000000000001,"cut_seq":77,"streak":2,"probe_n":13,"probe_at":1700000000000000002,"probe_top":14,"step":3,"gap":500000000,"refusal":40000000,"refusal_dev":5000000,"batch_lo":11,"batch_top":15,"batch_after":100,"batch_end":108,"batch_seen":[101,103,107,0,0,0,0,0],"batch_n":3,"batch_until":1700000000000000003}}`

// The stored learned state is a record of its own: format 1 reads and
// writes byte for byte what the learner's struct did when it was the
// record, so processes of both releases share a state in a rolling deploy.
func TestLearnedStateRecordIsFormatOne(t *testing.T) {
	var st storedCap
	require.NoError(t, json.Unmarshal([]byte(goldenState), &st))
	want := storedCap{Key: "provider", V: 42, E: 7, F: 1}
	want.Cap.Floor, want.Cap.Ceil, want.Cap.Retest = 1, 64, 10*time.Second
	want.Cap.Lo, want.Cap.Hi, want.Cap.HiAt, want.Cap.CutSeq, want.Cap.Streak = 12, 20, 1700000000000000001, 77, 2
	want.Cap.ProbeN, want.Cap.ProbeAt, want.Cap.ProbeTop, want.Cap.Step = 13, 1700000000000000002, 14, 3
	want.Cap.Gap, want.Cap.Refusal, want.Cap.RefusalDev = 500*time.Millisecond, 40*time.Millisecond, 5*time.Millisecond
	want.Cap.BatchLo, want.Cap.BatchTop, want.Cap.BatchAfter, want.Cap.BatchEnd = 11, 15, 100, 108
	want.Cap.BatchSeen[0], want.Cap.BatchSeen[1], want.Cap.BatchSeen[2] = 101, 103, 107
	want.Cap.BatchN, want.Cap.BatchUntil = 3, 1700000000000000003
	assert.Equal(t, want, st, "read")
	b, err := json.Marshal(st)
	require.NoError(t, err)
	assert.Equal(t, goldenState, string(b), "written back")
	assert.Equal(t, learnedFormat, 1, "a change of capRecord is a new format, and this test's golden a new one")
}

// Every field of the learner's state, each set to a value of its own, goes
// through the record and back: a field added to learn.Cap that capRecord
// does not carry (or a longer batch) fails here, and needs a new format.
func TestCapRecordCarriesEveryField(t *testing.T) {
	var c learn.Cap
	next := uint64(1)
	var fill func(reflect.Value)
	fill = func(f reflect.Value) {
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(next))
		case reflect.Uint64:
			f.SetUint(next)
		case reflect.Array:
			for i := range f.Len() {
				fill(f.Index(i))
			}
			return
		default:
			t.Fatalf("a field of kind %s: carry it in capRecord (a new format) and here", f.Kind())
		}
		next++
	}
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		fill(v.Field(i))
	}
	b, err := json.Marshal(storedCap{Key: "k", V: 1, F: learnedFormat, Cap: c})
	require.NoError(t, err)
	var st storedCap
	require.NoError(t, json.Unmarshal(b, &st))
	assert.Equal(t, c, st.Cap)
}
