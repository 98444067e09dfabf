package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/learn"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// A learned state in a later format (a later release's, during a rolling
// deploy; its "f" a number over 2, or anything but a whole number) is
// neither read nor written over: the process goes on with its own cap and
// says why, and the state stays as the later release wrote it. A message
// of one, of this fleet's epoch and a cap this release could read, is not
// taken either. So too with WithLearnedFormat(1), which writes a state of
// format 2 over in its own, but none of a later one.
func TestLearnedStateOfALaterFormatLeftAlone(t *testing.T) {
	for _, written := range []int{2, 1} {
		for _, f := range []string{`3`, `"3"`, `2.5`} {
			t.Run(fmt.Sprintf("writes %d, f=%s", written, f), func(t *testing.T) { laterFormatLeftAlone(t, written, f) })
		}
	}
}

func laterFormatLeftAlone(t *testing.T, written int, f string) {
	ctx := context.Background()
	ms := memstore.New()
	var logged testrig.Buffer
	r := New[string](ms, 100, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))), WithLearnedFormat(written))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
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
	r.learnedMessage(strings.Replace(string(b), fmt.Sprintf(`"f":%d`, written), `"f":`+f, 1))
	assert.Equal(t, 10, r.Learned("p").Cap, "the message not taken")

	later := `{"k":"p","v":` + res.Version + `9,"f":` + f + `,"cap":{"limit":{"requests":3,"tokens":4096}}}`
	w, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", Presumed: res.Version, State: later, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, w.Wrote)
	r.Report(s, upstream.Verdict{Kind: upstream.Concurrency}) // at 1 in flight: the cap is cut to 1
	s.Release()
	r.flushLearned("p")
	assert.Equal(t, 1, r.Learned("p").Cap, "its own evidence, on its own cap")
	fwUntil(t, "the reason logged", func() bool { return strings.Contains(logged.String(), "as a later release wrote it") })
	now, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", TTL: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, later, now.State, "left as the later release wrote it")
}

// In a rolling deploy from the release before, this release takes the
// state that release wrote (format 1) and writes its evidence over it in
// format 2; a process of the release before then goes on with its own cap
// and says why (TestLearnedStateOfALaterFormatLeftAlone, as that release
// tests it).
func TestLearnedStateOfTheReleaseBeforeTaken(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	one := `{"k":"p","v":5,"f":1,"cap":{"floor":1,"ceil":100,"retest":60000000000,"lo":12,"hi":100,"hi_at":0,"cut_seq":0,"streak":0,` +
		`"probe_n":0,"probe_at":0,"probe_top":0,"step":1,"gap":500000000,"refusal":0,"refusal_dev":0,"batch_lo":0,"batch_top":0,` +
		`"batch_after":0,"batch_end":0,"batch_seen":[0,0,0,0,0,0,0,0],"batch_n":0,"batch_until":0}}`
	w, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", Presumed: "-", State: one, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, w.Wrote)

	r := New[string](ms, 100, WithLogger(slog.New(slog.DiscardHandler)))
	defer r.Close()
	require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 3, Max: 50}))
	settled(t, r, "p")
	assert.Equal(t, 12, r.Learned("p").Cap, "the release before's cap taken")
	assert.Equal(t, 50, r.Learned("p").Max, "under this process's bounds")

	s, err := r.TryAcquire("p")
	require.NoError(t, err)
	r.Report(s, upstream.Verdict{Kind: upstream.Concurrency}) // at 1 in flight: the cap is cut to 1
	s.Release()
	r.flushLearned("p")
	now, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", TTL: time.Hour})
	require.NoError(t, err)
	var st storedCap
	require.NoError(t, json.Unmarshal([]byte(now.State), &st))
	assert.Equal(t, 2, st.F, "written over in format 2")
	assert.Equal(t, 1, st.Cap.Lo)
	assert.Greater(t, st.V, uint64(5))
	assert.NotContains(t, now.State, `"floor"`, "the bounds are each process's own")
}

// A process told to write format 1 (WithLearnedFormat, for a rolling
// deploy from a release that reads nothing later, or a rollback to one)
// writes its evidence in format 1, and writes a state it reads in format 2
// over in format 1 with no evidence at all; a process of the default
// leaves a state in format 1 as it is until it has evidence to write.
func TestLearnedFormatOne(t *testing.T) {
	assert.PanicsWithValue(t, "fleet: learned state format 3: 1 or 2", func() { WithLearnedFormat(3) })
	ctx := context.Background()
	read := func(ms *memstore.Store) storedCap {
		t.Helper()
		res, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: "p", TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, res.Found)
		var st storedCap
		require.NoError(t, json.Unmarshal([]byte(res.State), &st))
		require.True(t, st.Cap.Valid())
		return st
	}

	ms := memstore.New()
	two := New[string](ms, 100, WithLogger(quiet()))
	defer two.Close()
	require.NoError(t, two.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
	settled(t, two, "p")
	require.Equal(t, 2, read(ms).F, "the default writes format 2")

	one := New[string](ms, 100, WithLogger(quiet()), WithLearnedFormat(1))
	defer one.Close()
	require.NoError(t, one.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
	settled(t, one, "p")
	st := read(ms)
	assert.Equal(t, 1, st.F, "written over in format 1, with no evidence")
	assert.Equal(t, 10, st.Cap.Lo)
	assert.Equal(t, 500*time.Millisecond, time.Duration(formatOneOf(st.Cap).Gap), "the gap the release before reads")

	s, err := one.TryAcquire("p")
	require.NoError(t, err)
	one.Report(s, upstream.Verdict{Kind: upstream.Concurrency}) // at 1 in flight: the cap is cut to 1
	s.Release()
	one.flushLearned("p")
	st = read(ms)
	assert.Equal(t, 1, st.F, "its evidence in format 1")
	assert.Equal(t, 1, st.Cap.Lo)

	// The default process reads it (as it does each second), and leaves
	// it be.
	fwUntil(t, "the cut taken", func() bool { return two.Learned("p").Cap == 1 })
	two.learned.mu.Lock()
	two.learned.learning["p"].staleLocked()
	two.learned.mu.Unlock()
	two.kickLearner()
	settled(t, two, "p")
	again := read(ms)
	assert.Equal(t, 1, again.F, "no evidence: left in format 1")
	assert.Equal(t, st.V, again.V, "not written")
}

// goldenOne is a learned state in format 1, every field of its cap set, as
// the release before format 2 wrote it.
const goldenOne = `{"k":"provider","v":42,"e":7,"f":1,"cap":{"floor":1,"ceil":64,"retest":10000000000,"lo":12,"hi":20,"hi_at":1700000000000000001,"cut_seq":77,"streak":2,"probe_n":13,"probe_at":1700000000000000002,"probe_top":14,"step":3,"gap":500000000,"refusal":40000000,"refusal_dev":5000000,"batch_lo":11,"batch_top":15,"batch_after":100,"batch_end":108,"batch_seen":[101,103,107,0,0,0,0,0],"batch_n":3,"batch_until":1700000000000000003}}`

// goldenTwo is the same state in format 2.
const goldenTwo = `{"k":"provider","v":42,"e":7,"f":2,"cap":{"lo":12,"hi":20,"hi_at":1700000000000000001,"cut":77,"streak":2,"step":3,"refusal":{"mean":40000000,"dev":5000000},"probe":{"n":13,"at":1700000000000000002,"top":14},"batch":{"lo":11,"top":15,"after":100,"end":108,"seen":[101,103,107],"until":1700000000000000003}}}`

// goldenCap is the learner's state both goldens hold, but for what the
// reader's configuration sets (bounds, re-test interval).
func goldenCap() learn.Cap {
	c := learn.Cap{Lo: 12, Hi: 20, HiAt: 1700000000000000001, CutSeq: 77, Streak: 2,
		ProbeN: 13, ProbeAt: 1700000000000000002, ProbeTop: 14, Step: 3,
		Refusal: 40 * time.Millisecond, RefusalDev: 5 * time.Millisecond,
		BatchLo: 11, BatchTop: 15, BatchAfter: 100, BatchEnd: 108, BatchN: 3, BatchUntil: 1700000000000000003}
	c.BatchSeen[0], c.BatchSeen[1], c.BatchSeen[2] = 101, 103, 107
	return c
}

// A state written by the release before (format 1) is read, and so is one
// in format 2; each is written in the format its F says (the writer's:
// WithLearnedFormat), format 1 as the release before wrote it (its gap as
// it follows from the refusal times), format 2 byte for byte.
func TestLearnedStateFormats(t *testing.T) {
	var one, two storedCap
	require.NoError(t, json.Unmarshal([]byte(goldenOne), &one))
	want := storedCap{Key: "provider", V: 42, E: 7, F: 1, Cap: goldenCap()}
	want.Cap.Floor, want.Cap.Ceil, want.Cap.Retest = 1, 64, 10*time.Second // format 1 keeps the writer's, for no reader
	assert.Equal(t, want, one, "format 1 read")
	require.NoError(t, json.Unmarshal([]byte(goldenTwo), &two))
	assert.Equal(t, storedCap{Key: "provider", V: 42, E: 7, F: 2, Cap: goldenCap()}, two, "format 2 read")

	b, err := json.Marshal(one)
	require.NoError(t, err)
	assert.Equal(t, strings.Replace(goldenOne, `"gap":500000000`, `"gap":80000000`, 1), string(b), "format 1 written")
	one.F = 2
	b, err = json.Marshal(one)
	require.NoError(t, err)
	assert.Equal(t, goldenTwo, string(b), "format 2 written")
	assert.Equal(t, 2, learnedFormat, "a change of capRecord is a new format, and this test's golden a new one")

	// A new cap, its record as small as it gets.
	b, err = json.Marshal(storedCap{Key: "p", V: 1, Cap: *learn.FromMS(1, 40, 8, 0).New(40)})
	require.NoError(t, err)
	assert.Equal(t, `{"k":"p","v":1,"f":2,"cap":{"lo":8,"hi":40,"step":1}}`, string(b))

	var st storedCap
	seen := strings.Replace(goldenTwo, `[101,103,107]`, `[1,2,3,4,5,6,7,8,9]`, 1)
	require.ErrorIs(t, json.Unmarshal([]byte(seen), &st), errBatchSeen, "more refusals counted than a learner keeps")
	later := strings.Replace(goldenTwo, `"f":2`, `"f":3`, 1)
	require.ErrorIs(t, json.Unmarshal([]byte(later), &st), errLearnedFormat)
	long := strings.Replace(goldenTwo, `"mean":40000000`, `"mean":4611686018427387904`, 1)
	require.NoError(t, json.Unmarshal([]byte(long), &st))
	assert.False(t, st.Cap.Valid(), "a refusal time no learner makes, whose gap would overflow")

	// The release before kept a refusal of no time as a refusal time of 0
	// beside the shortest gap: read as timed at a nanosecond, the gap
	// stays the shortest.
	zero := strings.NewReplacer(`"gap":500000000,"refusal":40000000,"refusal_dev":5000000`, `"gap":20000000,"refusal":0,"refusal_dev":0`).Replace(goldenOne)
	require.NoError(t, json.Unmarshal([]byte(zero), &st))
	assert.Equal(t, 20*time.Millisecond, st.Cap.Gap())
	assert.Equal(t, time.Duration(1), st.Cap.Refusal)
	untimed := strings.NewReplacer(`"refusal":40000000,"refusal_dev":5000000`, `"refusal":0,"refusal_dev":0`).Replace(goldenOne)
	require.NoError(t, json.Unmarshal([]byte(untimed), &st))
	assert.Equal(t, 500*time.Millisecond, st.Cap.Gap(), "none timed")
	assert.Zero(t, st.Cap.Refusal)
}

// Every field of the learner's state, each set to a value of its own, goes
// through the record and back, in either format (format 2 but for the
// reader's configuration): a field added to learn.Cap that the record does
// not carry fails here, and needs a new format, or a reason it need not be
// stored (a longer batch does not compile: recordSeen).
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
	c.BatchN = len(c.BatchSeen)
	for _, f := range []int{1, 2} {
		b, err := json.Marshal(storedCap{Key: "k", V: 1, F: f, Cap: c})
		require.NoError(t, err)
		var st storedCap
		require.NoError(t, json.Unmarshal(b, &st))
		assert.Equal(t, f, st.F)
		if f == 2 {
			st.Cap.Floor, st.Cap.Ceil, st.Cap.Retest = c.Floor, c.Ceil, c.Retest // the reader's
		}
		assert.Equal(t, c, st.Cap, "format %d", f)
	}
}

// A learner whose state goes through the record after every step, in
// either format, under the reader's configuration, behaves as one whose
// state stays in memory, over random evidence as a fleet makes it: starts
// over the limit (another process's, under the limit it had), answers
// that come twice and late, a clock that steps back, bounds configured
// anew. What the record leaves out (a probe's start and top once it is
// answered, the refusals of a batch past those counted) is never read
// again.
func TestCapRecordLosesNothingTheLearnerReads(t *testing.T) {
	var probes, batches, streaks, twice int // the states and answers the walks went through
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		configured := 40
		s := learn.FromMS(1, configured, 8, 300)
		mem, rec := s.New(configured), s.New(configured)
		now, seq := int64(1_000_000_000), uint64(0)
		type start struct {
			n  int
			id uint64
			at int64
		}
		var out, answered []start
		for step := range 3000 {
			now += rng.Int64N(int64(60 * time.Millisecond))
			if rng.IntN(50) == 0 {
				now -= rng.Int64N(int64(3 * time.Second)) // the clock steps back
			}
			var op string
			switch k := rng.IntN(20); {
			case k < 7:
				seq++
				n := rng.IntN(mem.Limit(now)+2) + 1 // now and then over the limit
				mem.Started(n, now)
				rec.Started(n, now)
				out = append(out, start{n, seq, now})
				op = "start"
			case k < 16 && len(out) > 0:
				i := rng.IntN(len(out))
				st := out[i]
				if rng.IntN(8) == 0 && len(answered) > 0 {
					st = answered[rng.IntN(len(answered))] // once more
					twice++
				} else {
					out = slices.Delete(out, i, i+1)
					answered = append(answered, st)
				}
				switch rng.IntN(4) {
				case 0, 1:
					mem.Admitted(st.n, st.id, seq)
					rec.Admitted(st.n, st.id, seq)
				case 2:
					mem.Refused(st.n, st.id, st.at, now, seq)
					rec.Refused(st.n, st.id, st.at, now, seq)
				default:
					mem.Inconclusive(st.n, st.id, st.at)
					rec.Inconclusive(st.n, st.id, st.at)
				}
				op = "answer"
			case k == 16 && rng.IntN(10) == 0:
				mem.Overloaded(seq, seq)
				rec.Overloaded(seq, seq)
				op = "overloaded"
			case k == 17 && rng.IntN(20) == 0:
				configured = 20 + rng.IntN(40)
				s = learn.FromMS(1+rng.IntN(3), configured, 8, int64(100+rng.IntN(500)))
				s.Configure(mem, configured)
				s.Configure(rec, configured)
				op = "configured"
			default:
				mem.Tick(now, seq)
				rec.Tick(now, seq)
				op = "tick"
			}
			b, err := json.Marshal(storedCap{Key: "k", V: 1, F: 1 + step%2, Cap: *rec})
			require.NoError(t, err)
			var st storedCap
			require.NoError(t, json.Unmarshal(b, &st))
			require.True(t, st.Cap.Valid())
			s.Configure(&st.Cap, configured)
			*rec = st.Cap
			require.Equal(t, mem.Limit(now), rec.Limit(now), "seed %d step %d (%s)", seed, step, op)
			require.Equal(t, mem.WakeAt(now), rec.WakeAt(now), "seed %d step %d (%s)", seed, step, op)
			require.Equal(t, live(*mem), live(*rec), "seed %d step %d (%s)", seed, step, op)
			probes += min(mem.ProbeN, 1)
			batches += min(max(mem.BatchN-1, 0), 1)
			streaks += min(max(mem.Streak-2, 0), 1)
		}
	}
	t.Logf("steps with a probe out: %d, with a batch's second refusal counted: %d, with a streak of 3 or more: %d; answers given twice: %d",
		probes, batches, streaks, twice)
	assert.Positive(t, probes)
	assert.Positive(t, batches)
	assert.Positive(t, streaks)
	assert.Positive(t, twice)
}

// live is c without what the learner does not read again: a probe's start
// and top once none is out, the refusals counted past BatchN.
func live(c learn.Cap) learn.Cap {
	if c.ProbeN == 0 {
		c.ProbeAt, c.ProbeTop = 0, 0
	}
	clear(c.BatchSeen[c.BatchN:])
	return c
}
