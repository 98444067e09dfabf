package sweep

import (
	"cmp"
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// DefaultHandlerLimit is how many holders a Handler lists when the request
// does not say (?limit=N).
const DefaultHandlerLimit = 1000

// MaxHandlerLimit bounds ?limit=: a larger value lists this many.
const MaxHandlerLimit = 10_000

// HolderJSON is one holder as a Handler serves it. Every field name is
// snake_case; durations are in seconds, as fractions.
type HolderJSON struct {
	// Key is as fmt prints it ("" for a Limiter); quoted as Go would
	// (strconv.Quote) when that is not valid UTF-8 or starts with a quote,
	// so that string keys stay apart (keys of other types that fmt prints
	// alike read alike).
	Key        string    `json:"key"`
	SlotID     uint64    `json:"slot_id"` // one slot held under several keys has one id
	Units      int       `json:"units"`   // the units it holds of the key
	AcquiredAt time.Time `json:"acquired_at"`
	AgeSeconds float64   `json:"age_seconds"`
	LongHeld   bool      `json:"long_held"` // held for the threshold or longer
}

// HoldersJSON is the body a Handler serves.
type HoldersJSON struct {
	Now              time.Time    `json:"now"`
	InUse            int          `json:"in_use"` // every holder, listed or not (a multi-key slot counts per key)
	Units            int          `json:"units"`  // the units they hold, summed over keys: what the caps count
	Keys             int          `json:"keys"`   // keys with a holder (0 for a Limiter)
	LongHeld         int          `json:"long_held"`
	ThresholdSeconds float64      `json:"threshold_seconds"`
	Truncated        bool         `json:"truncated"` // more holders than the limit: the oldest are listed
	Holders          []HolderJSON `json:"holders"`   // oldest first
}

// Handler returns an http.Handler that serves what holds reg's capacity
// now, as HoldersJSON: every holder counted, the oldest listed with their
// ages, oldest first, at most ?limit=N of them (DefaultHandlerLimit; a
// value over MaxHandlerLimit lists MaxHandlerLimit). A limit that is not a
// whole number >= 0 is a 400 with a JSON body {"error": "..."}. It is for a
// debug endpoint: mount it behind the same access control as other
// operator endpoints, since keys name tenants. Of the options, WithClock
// and WithThreshold apply (the threshold marks long_held); the others are
// ignored.
//
// A request walks one lock shard at a time, as a sweep does, keeping only
// the oldest N holders as it goes: what it holds in memory is N holders
// and one shard's copy, however many holders there are.
func Handler[K comparable](reg *registry.Registry[K], opts ...Option) http.Handler {
	return newHolderHandler(func(visit func([]registry.Holder[K])) {
		if reg == nil {
			return // nothing held, as New(nil) watches nothing
		}
		var buf []registry.Holder[K]
		for i := range reg.Shards() {
			buf = reg.HoldersInShard(i, buf[:0])
			visit(buf)
		}
	}, true, opts)
}

// LimiterHandler is Handler for a Limiter, whose holders have the key "".
// A nil reg or l serves no holders.
func LimiterHandler(l *slots.Limiter, opts ...Option) http.Handler {
	return newHolderHandler(func(visit func([]registry.Holder[string])) {
		if l == nil {
			return
		}
		visit(limiterHolders(l))
	}, false, opts)
}

// limiterHolders returns l's holders as a Registry's, with the key "".
func limiterHolders(l *slots.Limiter) []registry.Holder[string] {
	hs := l.Holders(nil)
	buf := make([]registry.Holder[string], len(hs))
	for i, h := range hs {
		buf[i] = registry.Holder[string]{ID: h.ID, AcquiredAt: h.AcquiredAt, Units: h.Units}
	}
	return buf
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
		if o == nil {
			continue // a nil option is no option
		}
		o.apply(&cfg)
	}
	return &holderHandler[K]{walk: walk, clock: cfg.clock, threshold: cfg.threshold, keyed: keyed}
}

func (h *holderHandler[K]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	limit, ok := parseLimit(r.URL.Query().Get("limit"))
	if !ok {
		writeJSON(w, http.StatusBadRequest, struct {
			Error string `json:"error"`
		}{fmt.Sprintf("limit must be a whole number, 0 or more; at most %d holders are listed", MaxHandlerLimit)})
		return
	}
	now := h.clock.Now()
	out := HoldersJSON{Now: now.UTC(), ThresholdSeconds: h.threshold.Seconds(), Holders: []HolderJSON{}}
	oldest := &youngestFirst[K]{limit: limit}
	// A key's holders are all in one shard, so the keys are counted per
	// shard and the set is emptied between shards.
	keys := make(map[K]struct{})
	h.walk(func(hs []registry.Holder[K]) {
		for _, hd := range hs {
			out.InUse++
			out.Units += hd.Units
			if now.Sub(hd.AcquiredAt) >= h.threshold {
				out.LongHeld++
			}
			if h.keyed {
				keys[hd.Key] = struct{}{}
			}
			oldest.offer(hd)
		}
		out.Keys += len(keys)
		clear(keys)
	})
	slices.SortFunc(oldest.hs, func(a, b registry.Holder[K]) int { return compareAge(b, a) })
	for _, hd := range oldest.hs {
		age := now.Sub(hd.AcquiredAt)
		key := fmt.Sprint(hd.Key)
		if !utf8.ValidString(key) || strings.HasPrefix(key, `"`) { // a quoted one's spelling
			key = strconv.Quote(key)
		}
		out.Holders = append(out.Holders, HolderJSON{
			Key: key, SlotID: hd.ID, Units: hd.Units, AcquiredAt: hd.AcquiredAt.UTC(),
			AgeSeconds: age.Seconds(), LongHeld: age >= h.threshold,
		})
	}
	out.Truncated = out.InUse > len(out.Holders)
	writeJSON(w, http.StatusOK, out)
}

// parseLimit reads ?limit=: "" is the default, a value over
// MaxHandlerLimit (however large) is MaxHandlerLimit, and anything but
// digits is refused.
func parseLimit(s string) (int, bool) {
	if s == "" {
		return DefaultHandlerLimit, true
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	if err != nil || n > MaxHandlerLimit {
		return MaxHandlerLimit, true
	}
	return int(n), true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// compareAge orders holders youngest first: by acquire time, then slot id.
func compareAge[K comparable](a, b registry.Holder[K]) int {
	return cmp.Or(b.AcquiredAt.Compare(a.AcquiredAt), cmp.Compare(b.ID, a.ID))
}

// youngestFirst keeps the limit oldest holders offered to it, as a heap
// whose root is the youngest kept, the first to give way to an older one.
type youngestFirst[K comparable] struct {
	limit int
	hs    []registry.Holder[K]
}

func (q *youngestFirst[K]) offer(h registry.Holder[K]) {
	switch {
	case len(q.hs) < q.limit:
		heap.Push(q, h)
	case len(q.hs) > 0 && compareAge(h, q.hs[0]) > 0: // older than the youngest kept
		q.hs[0] = h
		heap.Fix(q, 0)
	}
}

func (q *youngestFirst[K]) Len() int           { return len(q.hs) }
func (q *youngestFirst[K]) Less(i, j int) bool { return compareAge(q.hs[i], q.hs[j]) < 0 }
func (q *youngestFirst[K]) Swap(i, j int)      { q.hs[i], q.hs[j] = q.hs[j], q.hs[i] }
func (q *youngestFirst[K]) Push(x any)         { q.hs = append(q.hs, x.(registry.Holder[K])) }
func (q *youngestFirst[K]) Pop() any {
	h := q.hs[len(q.hs)-1]
	q.hs = q.hs[:len(q.hs)-1]
	return h
}
