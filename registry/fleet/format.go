package fleet

// The formats of the records a fleet keeps in its store (learned states,
// overrides): a record in a later format than this code's, a later
// release's during a rolling deploy, is neither read nor written over.

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
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
