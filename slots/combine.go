package slots

import "github.com/inflight-go/inflight/internal/core"

// Combine holds the non-nil parts in one Slot, Bypassed or Degraded if one
// is, of the Units of its largest part.
func Combine(parts ...*Slot) *Slot {
	var buf [4]*core.Handle
	hs := buf[:0]
	for _, p := range parts {
		hs = append(hs, (*core.Handle)(p))
	}
	return (*Slot)(core.Combine(nil, hs...))
}
