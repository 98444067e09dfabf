package learn

import "time"

// Defaults of Settings (upstream.AdaptiveConfig's).
const (
	DefaultMin     = 1
	DefaultMax     = 1024
	DefaultInitial = 4
	DefaultRetest  = 10 * time.Second
)

// Settings are what a Cap learns within, as configured: a zero field takes
// its default.
type Settings struct {
	Min, Max, Initial int
	Retest            time.Duration
}

// FromMS returns the settings of a configuration's fields (an
// upstream.AdaptiveConfig's), the retest in milliseconds.
func FromMS(min, max, initial int, retestMS int64) Settings {
	return Settings{Min: min, Max: max, Initial: initial, Retest: time.Duration(retestMS) * time.Millisecond}
}

// Bounds returns the floor and the ceiling of the cap under a configured cap
// (0: none), which stays a ceiling.
func (s Settings) Bounds(configured int) (floor, ceiling int) {
	floor, ceiling = s.Min, s.Max
	if floor == 0 {
		floor = DefaultMin
	}
	if ceiling == 0 {
		ceiling = DefaultMax
		if configured > 0 {
			ceiling = configured
		}
	}
	if configured > 0 {
		ceiling = min(ceiling, configured)
	}
	return floor, ceiling
}

func (s Settings) retest() time.Duration {
	if s.Retest == 0 {
		return DefaultRetest
	}
	return s.Retest
}

// New returns a Cap learning under s and a configured cap (0: none).
func (s Settings) New(configured int) *Cap {
	floor, ceil := s.Bounds(configured)
	init := s.Initial
	if init == 0 {
		init = DefaultInitial
	}
	return New(floor, ceil, init, s.retest())
}

// Configure applies s, under a configured cap, to c.
func (s Settings) Configure(c *Cap, configured int) {
	floor, ceil := s.Bounds(configured)
	c.Configure(floor, ceil, s.retest())
}
