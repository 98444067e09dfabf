package fleet

// The formats of the records a fleet keeps in its store (learned states,
// overrides): a record in a later format than this code's, a later
// release's during a rolling deploy, is neither read nor written over.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/inflight-go/inflight/internal/learn"
)

// learnedFormat is the format of the learned states this code writes
// unless told otherwise (WithLearnedFormat), and the latest it reads (it
// reads format 1 too). A state in a later one (a later release's, during
// a rolling deploy) is neither read nor written over: the process goes on
// with its own cap for the key and logs why (errLearnedFormat), until it
// is upgraded.
const learnedFormat = 2

// errLearnedFormat is the error of a sync that met a state in a later
// format.
var errLearnedFormat = errors.New("the store's learned state is in a later format, written by a later release: upgrade this process")

// learnedFormatOf returns the format of a stored state, read before the
// rest so that a later format's cap, whatever its shape, is not taken for
// a bad state; ok false if it cannot be read at all.
func learnedFormatOf(state string) (key string, format int, ok bool) {
	var head struct {
		Key string          `json:"k"`
		F   json.RawMessage `json:"f"`
	}
	if json.Unmarshal([]byte(state), &head) != nil {
		return "", 0, false
	}
	return head.Key, formatOf(head.F), true
}

// formatOf reads a record's "f": none is 0; one that is not a whole number
// of this code's range is later than any this code knows.
func formatOf(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	var f int
	if json.Unmarshal(raw, &f) != nil || f < 0 {
		return math.MaxInt
	}
	return f
}

// formatName names a format formatOf read: its number, or "not a whole
// number".
func formatName(f int) string {
	if f == math.MaxInt {
		return "not a whole number"
	}
	return strconv.Itoa(f)
}

// capRecord is a learned cap as format 2 of a learned state writes it: what
// the processes of a fleet must agree on to learn one cap, and nothing of
// the learner's own making. Each process's configuration (the bounds, the
// re-test interval) is its own, applied to what it reads; what follows from
// the rest (the learner's Gap, the count of refusals seen) is not stored;
// a probe's start and top are kept only while it is out. Times are the
// clock nanos of PROTOCOL.md, durations nanoseconds. A change of this
// record is a new format; the learner may change behind it.
type capRecord struct {
	Lo      int           `json:"lo"`               // starts may reach it without a test
	Hi      int           `json:"hi"`               // the cap is at most this, as of HiAt
	HiAt    int64         `json:"hi_at,omitempty"`  // when the last cut or ceiling was found
	Cut     uint64        `json:"cut,omitempty"`    // starts numbered up to it came before that (or the last reopened ceiling)
	Streak  int           `json:"streak,omitempty"` // refusals since the last admission after a cut
	Step    int           `json:"step"`             // the next batch of probes' width
	Refusal refusalRecord `json:"refusal,omitzero"`
	Probe   probeRecord   `json:"probe,omitzero"` // the batch of probes out, if one is
	Batch   batchRecord   `json:"batch,omitzero"` // the last batch of probes, and its refusals
}

// refusalRecord is how long a refusal takes: its moving mean, and its
// deviation from it.
type refusalRecord struct {
	Mean int64 `json:"mean"`
	Dev  int64 `json:"dev"`
}

// probeRecord is a batch of probes out: the highest start of it, when that
// start went, and the limit while it is out.
type probeRecord struct {
	N   int   `json:"n"`
	At  int64 `json:"at"`
	Top int   `json:"top"`
}

// batchRecord is the last batch of probes: the cap when it began, and if
// it was refused, its top, the starts that belong to it (numbered above
// After, up to End) and those of them refused so far; no probe goes before
// Until while they come in. With no top and none seen, After and End hold
// the starts of the last reopened ceiling instead (see learn.Cap).
type batchRecord struct {
	Lo    int      `json:"lo"`
	Top   int      `json:"top,omitempty"`
	After uint64   `json:"after,omitempty"`
	End   uint64   `json:"end,omitempty"`
	Seen  []uint64 `json:"seen,omitempty"`
	Until int64    `json:"until,omitempty"`
}

// recordSeen is how many refusals of a batch format 2 counts: as many as
// the learner, and a change of either does not compile here (it is a new
// format). Format 1 holds 8, as it always did.
const recordSeen = 8

const _ = uint(len(learn.Cap{}.BatchSeen)-recordSeen) + uint(recordSeen-len(learn.Cap{}.BatchSeen))

// recordOf returns c as format 2 records it.
func recordOf(c learn.Cap) capRecord {
	r := capRecord{Lo: c.Lo, Hi: c.Hi, HiAt: c.HiAt, Cut: c.CutSeq, Streak: c.Streak, Step: c.Step,
		Refusal: refusalRecord{Mean: int64(c.Refusal), Dev: int64(c.RefusalDev)},
		Batch:   batchRecord{Lo: c.BatchLo, Top: c.BatchTop, After: c.BatchAfter, End: c.BatchEnd, Until: c.BatchUntil}}
	if n := min(c.BatchN, recordSeen); n > 0 {
		r.Batch.Seen = slices.Clone(c.BatchSeen[:n])
	}
	if c.ProbeN != 0 {
		r.Probe = probeRecord{N: c.ProbeN, At: c.ProbeAt, Top: c.ProbeTop}
	}
	return r
}

// errBatchSeen is the error of a record that counts more refusals of a
// batch than a learner can.
var errBatchSeen = errors.New("fleet: a learned state counts more refusals of a batch than a learner keeps")

// cap returns the learner's state that r records, its bounds and re-test
// interval left for the reader's configuration to set (a ceiling with no
// time is the writer's bound, none found: Configure puts the reader's in
// its place).
func (r capRecord) cap() (learn.Cap, error) {
	c := learn.Cap{Lo: r.Lo, Hi: r.Hi, HiAt: r.HiAt, CutSeq: r.Cut, Streak: r.Streak, Step: r.Step,
		Refusal: time.Duration(r.Refusal.Mean), RefusalDev: time.Duration(r.Refusal.Dev),
		ProbeN: r.Probe.N, ProbeAt: r.Probe.At, ProbeTop: r.Probe.Top,
		BatchLo: r.Batch.Lo, BatchTop: r.Batch.Top, BatchAfter: r.Batch.After, BatchEnd: r.Batch.End,
		BatchN: len(r.Batch.Seen), BatchUntil: r.Batch.Until}
	if len(r.Batch.Seen) > recordSeen {
		return c, errBatchSeen
	}
	copy(c.BatchSeen[:], r.Batch.Seen)
	return c, nil
}

// storedRecord is a storedCap as the store and the messages carry it; its
// cap is read as its format says.
type storedRecord struct {
	Key string          `json:"k"`
	V   uint64          `json:"v"`
	E   int64           `json:"e,omitempty"`
	F   int             `json:"f,omitempty"`
	Cap json.RawMessage `json:"cap"`
}

// MarshalJSON writes s as its record: in format 1 if its F is 1 (see
// WithLearnedFormat), else in format 2.
func (s storedCap) MarshalJSON() ([]byte, error) {
	var c []byte
	var err error
	f := learnedFormat
	if s.F == 1 {
		f = 1
		c, err = json.Marshal(formatOneOf(s.Cap))
	} else {
		c, err = json.Marshal(recordOf(s.Cap))
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(storedRecord{Key: s.Key, V: s.V, E: s.E, F: f, Cap: c})
}

// UnmarshalJSON reads s from its record, in format 1 or 2.
func (s *storedCap) UnmarshalJSON(b []byte) error {
	var r storedRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	*s = storedCap{Key: r.Key, V: r.V, E: r.E, F: r.F}
	var err error
	switch r.F {
	case 0, 1:
		var one formatOne
		err = json.Unmarshal(r.Cap, &one)
		s.Cap = one.cap()
	case learnedFormat:
		var two capRecord
		if err = json.Unmarshal(r.Cap, &two); err == nil {
			s.Cap, err = two.cap()
		}
	default:
		err = fmt.Errorf("%w (its format: %d)", errLearnedFormat, r.F)
	}
	return err
}

// formatOne is a learned cap as format 1 has it: the learner's fields of
// the release that wrote it, flat. This release reads it, and writes it
// when told to (WithLearnedFormat), for processes of a release that reads
// nothing later. A reader applies its own bounds and re-test interval over
// the record's.
type formatOne struct {
	formatOneCap
	formatOneBatch
}

type formatOneCap struct {
	Floor      int    `json:"floor"`
	Ceil       int    `json:"ceil"`
	Retest     int64  `json:"retest"`
	Lo         int    `json:"lo"`
	Hi         int    `json:"hi"`
	HiAt       int64  `json:"hi_at"`
	CutSeq     uint64 `json:"cut_seq"`
	Streak     int    `json:"streak"`
	ProbeN     int    `json:"probe_n"`
	ProbeAt    int64  `json:"probe_at"`
	ProbeTop   int    `json:"probe_top"`
	Step       int    `json:"step"`
	Gap        int64  `json:"gap"`
	Refusal    int64  `json:"refusal"`
	RefusalDev int64  `json:"refusal_dev"`
}

type formatOneBatch struct {
	BatchLo    int       `json:"batch_lo"`
	BatchTop   int       `json:"batch_top"`
	BatchAfter uint64    `json:"batch_after"`
	BatchEnd   uint64    `json:"batch_end"`
	BatchSeen  [8]uint64 `json:"batch_seen"` // as format 1 has it, whatever the learner's
	BatchN     int       `json:"batch_n"`
	BatchUntil int64     `json:"batch_until"`
}

// formatOneOf returns c as format 1 records it, its gap as it follows
// from its refusal times.
func formatOneOf(c learn.Cap) formatOne {
	r := formatOne{
		formatOneCap{Floor: c.Floor, Ceil: c.Ceil, Retest: int64(c.Retest), Lo: c.Lo, Hi: c.Hi, HiAt: c.HiAt,
			CutSeq: c.CutSeq, Streak: c.Streak, ProbeN: c.ProbeN, ProbeAt: c.ProbeAt, ProbeTop: c.ProbeTop,
			Step: c.Step, Gap: int64(c.Gap()), Refusal: int64(c.Refusal), RefusalDev: int64(c.RefusalDev)},
		formatOneBatch{BatchLo: c.BatchLo, BatchTop: c.BatchTop, BatchAfter: c.BatchAfter, BatchEnd: c.BatchEnd,
			BatchN: c.BatchN, BatchUntil: c.BatchUntil}}
	copy(r.BatchSeen[:], c.BatchSeen[:])
	return r
}

// cap returns the learner's state that r records; a BatchN out of range
// is left for Valid to refuse. A release before this one kept a refusal
// of no time (on a virtual clock), or a mean worn down to nothing, as a
// refusal time of 0 beside a gap it had set: taken here as timed at a
// nanosecond, so that the gap stays about what it was.
func (r formatOne) cap() learn.Cap {
	c := learn.Cap{Floor: r.Floor, Ceil: r.Ceil, Retest: time.Duration(r.Retest), Lo: r.Lo, Hi: r.Hi, HiAt: r.HiAt,
		CutSeq: r.CutSeq, Streak: r.Streak, ProbeN: r.ProbeN, ProbeAt: r.ProbeAt, ProbeTop: r.ProbeTop, Step: r.Step,
		Refusal: time.Duration(r.Refusal), RefusalDev: time.Duration(r.RefusalDev),
		BatchLo: r.BatchLo, BatchTop: r.BatchTop, BatchAfter: r.BatchAfter, BatchEnd: r.BatchEnd,
		BatchN: r.BatchN, BatchUntil: r.BatchUntil}
	if c.Refusal == 0 && r.Gap > 0 && time.Duration(r.Gap) != new(learn.Cap).Gap() {
		c.Refusal = 1
	}
	copy(c.BatchSeen[:], r.BatchSeen[:])
	return c
}
