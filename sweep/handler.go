package sweep

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// DefaultHandlerLimit is how many holders a Handler lists when the request
// does not say (?limit=N).
const DefaultHandlerLimit = 1000

// HolderJSON is one holder as a Handler serves it. Every field name is
// snake_case; durations are in seconds, as fractions.
type HolderJSON struct {
	Key        string    `json:"key"`     // as fmt prints it; "" for a Limiter
	SlotID     uint64    `json:"slot_id"` // one slot held under several keys has one id
	AcquiredAt time.Time `json:"acquired_at"`
	AgeSeconds float64   `json:"age_seconds"`
	LongHeld   bool      `json:"long_held"` // held for the threshold or longer
}

// HoldersJSON is the body a Handler serves.
type HoldersJSON struct {
	Now              time.Time    `json:"now"`
	InUse            int          `json:"in_use"` // every holder, listed or not (a multi-key slot counts per key)
	Keys             int          `json:"keys"`   // keys with a holder (0 for a Limiter)
	LongHeld         int          `json:"long_held"`
	ThresholdSeconds float64      `json:"threshold_seconds"`
	Truncated        bool         `json:"truncated"` // more holders than the limit: the oldest are listed
	Holders          []HolderJSON `json:"holders"`   // oldest first
}

// Handler returns an http.Handler that serves what holds reg's capacity
// now, as HoldersJSON: every holder with its age, oldest first, at most
// ?limit=N of them (DefaultHandlerLimit). It is for a debug endpoint:
// mount it behind the same access control as other operator endpoints,
// since keys name tenants. Of the options, WithClock and WithThreshold
// apply (the threshold marks long_held); the others are ignored. A walk
// takes one lock shard at a time, as a sweep does.
func Handler[K comparable](reg *registry.Registry[K], opts ...Option) http.Handler {
	return newHolderHandler(func(visit func([]registry.Holder[K])) {
		var buf []registry.Holder[K]
		for i := range reg.Shards() {
			buf = reg.HoldersInShard(i, buf[:0])
			visit(buf)
		}
	}, true, opts)
}

// LimiterHandler is Handler for a Limiter, whose holders have the key "".
func LimiterHandler(l *slots.Limiter, opts ...Option) http.Handler {
	return newHolderHandler(func(visit func([]registry.Holder[string])) {
		hs := l.Holders(nil)
		buf := make([]registry.Holder[string], len(hs))
		for i, h := range hs {
			buf[i] = registry.Holder[string]{ID: h.ID, AcquiredAt: h.AcquiredAt}
		}
		visit(buf)
	}, false, opts)
}

type holderHandler[K comparable] struct {
	walk      func(visit func([]registry.Holder[K]))
	clock     clock.Clock
	threshold time.Duration
	keyed     bool // a registry; a Limiter has no keys
}

func newHolderHandler[K comparable](walk func(func([]registry.Holder[K])), keyed bool, opts []Option) http.Handler {
	cfg := config{threshold: DefaultThreshold, clock: clock.New()}
	for _, o := range opts {
		o(&cfg)
	}
	return &holderHandler[K]{walk: walk, clock: cfg.clock, threshold: cfg.threshold, keyed: keyed}
}

func (h *holderHandler[K]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	limit := DefaultHandlerLimit
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			http.Error(w, "limit: want a whole number >= 0", http.StatusBadRequest)
			return
		}
		limit = n
	}
	now := h.clock.Now()
	out := HoldersJSON{Now: now.UTC(), ThresholdSeconds: h.threshold.Seconds(), Holders: []HolderJSON{}}
	keys := make(map[K]struct{})
	h.walk(func(hs []registry.Holder[K]) {
		for _, hd := range hs {
			age := now.Sub(hd.AcquiredAt)
			out.InUse++
			keys[hd.Key] = struct{}{}
			if age >= h.threshold {
				out.LongHeld++
			}
			out.Holders = append(out.Holders, HolderJSON{
				Key: fmt.Sprint(hd.Key), SlotID: hd.ID, AcquiredAt: hd.AcquiredAt.UTC(),
				AgeSeconds: age.Seconds(), LongHeld: age >= h.threshold,
			})
		}
	})
	if h.keyed {
		out.Keys = len(keys)
	}
	slices.SortFunc(out.Holders, func(a, b HolderJSON) int {
		return cmp.Or(a.AcquiredAt.Compare(b.AcquiredAt), cmp.Compare(a.SlotID, b.SlotID))
	})
	if len(out.Holders) > limit {
		out.Holders, out.Truncated = out.Holders[:limit], true
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}
