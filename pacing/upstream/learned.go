package upstream

import (
	"fmt"
	"time"

	"github.com/inflight-go/inflight/internal/badfield"
	"github.com/inflight-go/inflight/internal/learn"
)

// The defaults of AdaptiveConfig's fields.
const (
	DefaultAdaptiveMin     = learn.DefaultMin
	DefaultAdaptiveMax     = learn.DefaultMax
	DefaultAdaptiveInitial = learn.DefaultInitial
	DefaultRetest          = learn.DefaultRetest
)

// MaxMS bounds a setting in milliseconds: a day. More is surely a mistake,
// and far more would overflow a time.Duration.
const MaxMS = 24 * 60 * 60 * 1000

// AdaptiveConfig turns on the learned cap: the cap is learned from what the
// upstream answers (pacing's Gate.Report, a fleet's Report) instead of
// configured. Every field is optional; the section's presence turns
// learning on. A configured cap stays a ceiling.
type AdaptiveConfig struct {
	// Min is the floor of the learned cap; DefaultAdaptiveMin when left
	// out.
	Min int `json:"min,omitempty"`
	// Max is its ceiling: the smaller of this and a configured cap when
	// both are set; DefaultAdaptiveMax when neither is.
	Max int `json:"max,omitempty"`
	// Initial is where learning starts; DefaultAdaptiveInitial (within
	// [Min, Max]) when left out.
	Initial int `json:"initial,omitempty"`
	// RetestMS is how long a ceiling found by a 429 holds before one
	// request tests whether it has risen, in milliseconds; DefaultRetest
	// when left out. Each test that finds the ceiling unchanged costs one 429:
	// shorter finds a rise sooner and costs more. While demand stays over
	// the cap, that is a 429 every RetestMS per learned cap (six a minute
	// at the default), whatever the traffic.
	RetestMS int64 `json:"retest_ms,omitempty"`
}

// Validate reports whether a is a valid learning setup under a configured
// cap (0: none): no field negative, RetestMS at most MaxMS, and the floor
// not over the ceiling.
func (a AdaptiveConfig) Validate(configured int) error { return a.Check("adaptive", configured) }

// Check is Validate for a section at path in a configuration file (such
// as `models["glm-5"].adaptive`): its errors name the field by its JSON path.
func (a AdaptiveConfig) Check(path string, configured int) error {
	bad := func(field string, v any, why string) error { return badfield.Error(path+"."+field, v, why) }
	switch {
	case a.Min < 0:
		return bad("min", a.Min, "is negative")
	case a.Max < 0:
		return bad("max", a.Max, "is negative")
	case a.Initial < 0:
		return bad("initial", a.Initial, "is negative")
	case a.RetestMS < 0 || a.RetestMS > MaxMS:
		return bad("retest_ms", a.RetestMS, fmt.Sprintf("is outside [0, %d]", MaxMS))
	}
	if lo, hi := a.Bounds(configured); lo > hi {
		return bad("min", lo, fmt.Sprintf("is over the ceiling %d", hi))
	}
	return nil
}

// Bounds returns the floor and the ceiling the cap moves within under a
// configured cap (0: none), which stays a ceiling, the defaults filled in.
func (a AdaptiveConfig) Bounds(configured int) (floor, ceiling int) {
	return learn.Settings{Min: a.Min, Max: a.Max}.Bounds(configured)
}

// Learned is the state of a learned cap.
type Learned struct {
	Enabled bool
	Limit   int // the limit admissions run under now (the floor while the test of a cut is out)
	Cap     int // the learned cap: starts up to it go without a test
	Ceiling int // the cap is at most this, as last seen (Max when unknown)
	// Floor and Max are the bounds the cap moves within: AdaptiveConfig's
	// Min and Max with their defaults, Max no higher than a configured
	// cap. Both are 0 when this cap is not learned.
	Floor, Max int
	Changes    uint64 // changes of Cap or Ceiling, the setting of the first included
	// ByKind counts the answers reported, by the Kind of their verdict.
	ByKind    [len(kindNames)]uint64
	PausedFor time.Duration // new starts wait this long for a Retry-After
	// Keys is each API key's learned cap when a key pool learns (the
	// fields above are then the provider's configured ones, and zero).
	Keys map[string]Learned
	// Models is the learned cap of each model with an adaptive section.
	Models map[string]Learned
}
