package fleet

// The formats of the records a fleet keeps in its store (learned states,
// overrides): a record in a later format than this code's, a later
// release's during a rolling deploy, is neither read nor written over.

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/inflight-go/inflight/internal/learn"
)

// learnedFormat is the format of the learned states this code writes, and
// the latest it reads. A state in a later one (a later release's, during a
// rolling deploy) is neither read nor written over: the process goes on
// with its own cap for the key and logs why (errLearnedFormat), until it
// is upgraded.
const learnedFormat = 1

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

// capRecord is a learned cap as format 1 of a learned state writes it: a
// record of its own, apart from the learner's struct (learn.Cap), so that
// the learner can change without changing what the store holds; a change of
// this record is a new format. Durations are nanoseconds, times the clock
// nanos of PROTOCOL.md.
type capRecord struct {
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
	batchRecord
}

// batchRecord is the batch of refusals a learned cap counts, in its
// capRecord: embedded, so its fields stand beside the others in the JSON.
type batchRecord struct {
	BatchLo    int       `json:"batch_lo"`
	BatchTop   int       `json:"batch_top"`
	BatchAfter uint64    `json:"batch_after"`
	BatchEnd   uint64    `json:"batch_end"`
	BatchSeen  [8]uint64 `json:"batch_seen"`
	BatchN     int       `json:"batch_n"`
	BatchUntil int64     `json:"batch_until"`
}

// The batch of refusals counted is as long in the record as in the
// learner: a change of either does not compile here.
const _ = uint(len(learn.Cap{}.BatchSeen)-len(capRecord{}.BatchSeen)) + uint(len(capRecord{}.BatchSeen)-len(learn.Cap{}.BatchSeen))

// recordOf returns c as format 1 records it.
func recordOf(c learn.Cap) capRecord {
	r := capRecord{Floor: c.Floor, Ceil: c.Ceil, Retest: int64(c.Retest), Lo: c.Lo, Hi: c.Hi, HiAt: c.HiAt,
		CutSeq: c.CutSeq, Streak: c.Streak, ProbeN: c.ProbeN, ProbeAt: c.ProbeAt, ProbeTop: c.ProbeTop,
		Step: c.Step, Gap: int64(c.Gap), Refusal: int64(c.Refusal), RefusalDev: int64(c.RefusalDev),
		batchRecord: batchRecord{BatchLo: c.BatchLo, BatchTop: c.BatchTop, BatchAfter: c.BatchAfter,
			BatchEnd: c.BatchEnd, BatchN: c.BatchN, BatchUntil: c.BatchUntil}}
	copy(r.BatchSeen[:], c.BatchSeen[:])
	return r
}

// cap returns the learner's state that r records.
func (r capRecord) cap() learn.Cap {
	c := learn.Cap{Floor: r.Floor, Ceil: r.Ceil, Retest: time.Duration(r.Retest), Lo: r.Lo, Hi: r.Hi, HiAt: r.HiAt,
		CutSeq: r.CutSeq, Streak: r.Streak, ProbeN: r.ProbeN, ProbeAt: r.ProbeAt, ProbeTop: r.ProbeTop,
		Step: r.Step, Gap: time.Duration(r.Gap), Refusal: time.Duration(r.Refusal), RefusalDev: time.Duration(r.RefusalDev),
		BatchLo: r.BatchLo, BatchTop: r.BatchTop, BatchAfter: r.BatchAfter, BatchEnd: r.BatchEnd,
		BatchN: r.BatchN, BatchUntil: r.BatchUntil}
	copy(c.BatchSeen[:], r.BatchSeen[:])
	return c
}

// storedRecord is a storedCap as the store and the messages carry it.
type storedRecord struct {
	Key string    `json:"k"`
	V   uint64    `json:"v"`
	E   int64     `json:"e,omitempty"`
	F   int       `json:"f,omitempty"`
	Cap capRecord `json:"cap"`
}

// MarshalJSON writes s as its record.
func (s storedCap) MarshalJSON() ([]byte, error) {
	return json.Marshal(storedRecord{Key: s.Key, V: s.V, E: s.E, F: s.F, Cap: recordOf(s.Cap)})
}

// UnmarshalJSON reads s from its record.
func (s *storedCap) UnmarshalJSON(b []byte) error {
	var r storedRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	*s = storedCap{Key: r.Key, V: r.V, E: r.E, F: r.F, Cap: r.Cap.cap()}
	return nil
}
