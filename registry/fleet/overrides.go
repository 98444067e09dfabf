package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
)

// Overrides is a small map from names to limits that every process of a
// fleet shares through its store: the place for an operator's changes (an
// org's cap raised for a night, a tenant turned off) that must hold on
// every gateway, not only on the one that took the request, and outlive
// their restarts.
//
// Each process keeps a copy, read without a store call (Get, All). A change
// (Set, Delete) is written to the store at once, compared and swapped, so
// two processes changing different names at the same moment both keep their
// change. The store publishes it: the other processes take it as soon as
// the message arrives, and in any case at their next read, every second.
// The onChange function given to NewOverrides tells a process which names
// changed, so that it can apply them (registry.Registry.RefreshLimits, or
// fleet.Registry.SetLimit).
//
// A process started while the store cannot be reached has no copy until
// its first read succeeds (Synced tells): a limit it applies meanwhile is
// the one it would have without overrides. While the store cannot be
// reached each process keeps the copy it has, and Set and Delete fail. A
// store that lost its data (a Redis without persistence restarted, a
// failover to a replica that lagged) has the overrides written back by the
// processes that knew them, the latest copy winning: they live as long as
// one process does, and for a year after the last one read them. A process
// that has seen no overrides waits a second before its first change to a
// store that has none, so that those processes can write them back first.
//
// It is meant for tens to a few thousand names: the whole map is one record
// of at most 64 KiB, read each second by each process. PostgreSQL publishes
// at most 8000 bytes: past that (about 400 names of 10 bytes) the other
// processes take a change at their next read.
type Overrides struct {
	store    driver.Store
	key      string
	onChange func(name string)
	log      *slog.Logger

	mu       sync.RWMutex
	limits   map[string]int
	version  uint64 // the latest seen
	taken    uint64 // counts the records taken
	synced   bool
	warnedAt time.Time // when a write last logged that it was not published

	// tell serializes taking a record and telling onChange of it, so that
	// onChange hears the changes in their order.
	tell sync.Mutex

	closed atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
}

// MaxOverrides is how many names an Overrides holds at most.
const MaxOverrides = 10000

// maxOverridesBytes bounds the record, encoded: each process reads it
// every second.
const maxOverridesBytes = 64 << 10

// maxOverrideName bounds a name, in bytes.
const maxOverrideName = 512

// overridesPrefix starts the store key of an Overrides. Learn refuses a key
// whose name starts with it, so a learned cap's record and the overrides'
// never meet.
const overridesPrefix = "\x00overrides/"

// overridesTTL is how long the store keeps the overrides after the last
// read; every process reads them each refresh.
const overridesTTL = 366 * 24 * time.Hour

// overridesRefresh is how often each process reads the overrides.
const overridesRefresh = time.Second

// overridesTries bounds the compare-and-swap rounds of one change.
const overridesTries = 64

var (
	// ErrOverridesConflict is returned by Set and Delete when other
	// processes changed the overrides at every one of its tries.
	ErrOverridesConflict = errors.New("fleet: overrides changed by other processes at every try")
	// ErrOverridesFull is wrapped by the error of a Set that would take
	// the overrides past MaxOverrides names or 64 KiB.
	ErrOverridesFull = errors.New("fleet: overrides full")
	// ErrBadOverride is wrapped by the error of a Set or Delete whose name
	// or limit is not valid.
	ErrBadOverride = errors.New("fleet: bad override")
)

// overridesRecord is the overrides as the store keeps them and publishes
// them: the version first (the store reads the first "v"), the store key,
// the record's format, the limits.
type overridesRecord struct {
	V      uint64         `json:"v"`
	Key    string         `json:"k"`
	Format int            `json:"f"`
	Limits map[string]int `json:"limits,omitempty"`
}

// overridesFormat is the format of the records this code writes, and the
// latest it reads. A later one (written by a later release, during a
// rolling deploy) is neither read nor written over: Sync and changes fail
// with ErrOverridesFormat until this process is upgraded.
const overridesFormat = 1

// ErrOverridesFormat is wrapped by the error of a Sync, Set or Delete that
// met a record in a format later than this code's: a later release wrote
// it, and this process leaves it alone.
var ErrOverridesFormat = errors.New("fleet: overrides written in a later format; upgrade this process")

// NewOverrides returns the overrides named name on store (one name per set:
// "org-limits"), and starts reading them in the background; Sync reads them
// now. onChange, if not nil, is called with each name whose limit was set,
// changed or deleted, by this process or another, after the copy holds the
// change: one call at a time, in the order of the changes, so it must not
// call Set, Delete, Sync or Close; a panic in it is logged and goes no
// further.
// The store must not be nil, the name UTF-8 of 1 to 512 bytes. Close stops
// it.
func NewOverrides(store driver.Store, name string, onChange func(name string), logger *slog.Logger) (*Overrides, error) {
	if store == nil {
		return nil, errors.New("fleet: NewOverrides: nil store")
	}
	if err := validOverrideName(name); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := &Overrides{
		store: store, key: overridesPrefix + name, onChange: onChange, log: logger,
		limits: map[string]int{}, cancel: cancel, done: make(chan struct{}),
	}
	go o.run(ctx)
	return o, nil
}

func validOverrideName(name string) error {
	if name == "" || len(name) > maxOverrideName || !utf8.ValidString(name) {
		return fmt.Errorf("%w: name %q: want 1 to %d bytes of UTF-8", ErrBadOverride, name, maxOverrideName)
	}
	return nil
}

// Get returns name's limit, from this process's copy.
func (o *Overrides) Get(name string) (limit int, ok bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	limit, ok = o.limits[name]
	return limit, ok
}

// All returns a copy of every override, from this process's copy.
func (o *Overrides) All() map[string]int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return maps.Clone(o.limits)
}

// Synced tells whether this process has read the overrides from the store
// at least once: before that, its copy holds only its own changes.
func (o *Overrides) Synced() bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.synced
}

// Set sets name's limit for every process: n >= 0 (0 admits nobody), or
// slots.Unlimited. It returns once the store holds it. It fails with an
// error that wraps ErrBadOverride if n or name is not valid,
// ErrOverridesFull if the overrides would be too many or too large,
// ErrOverridesConflict, ErrOverridesFormat, ErrClosed, or the store's error
// (the change may or may not have been made: Get tells what this process
// knows).
func (o *Overrides) Set(ctx context.Context, name string, n int) error {
	if n < 0 && n != slots.Unlimited {
		return fmt.Errorf("%w: %q: limit %d: want >= 0 or slots.Unlimited", ErrBadOverride, name, n)
	}
	if err := validOverrideName(name); err != nil {
		return err
	}
	_, err := o.change(ctx, func(m map[string]int) (bool, error) {
		old, ok := m[name]
		if ok && old == n {
			return false, nil
		}
		if !ok && len(m) >= MaxOverrides {
			return false, fmt.Errorf("%w: %q: %d names already", ErrOverridesFull, name, MaxOverrides)
		}
		m[name] = n
		return true, nil
	})
	return err
}

// Delete removes name's override for every process, and tells whether
// there was one. Its errors are Set's.
func (o *Overrides) Delete(ctx context.Context, name string) (bool, error) {
	return o.change(ctx, func(m map[string]int) (bool, error) {
		if _, ok := m[name]; !ok {
			return false, nil
		}
		delete(m, name)
		return true, nil
	})
}

// Sync reads the overrides from the store now and takes them; if the store
// lost them, it writes this process's copy back.
func (o *Overrides) Sync(ctx context.Context) error {
	if o.closed.Load() {
		return ErrClosed
	}
	_, _, err := o.sync(ctx)
	return err
}

// Close stops the background reads; Set, Delete and Sync fail with
// ErrClosed after it. The store keeps the overrides.
func (o *Overrides) Close() {
	o.closed.Store(true)
	o.cancel()
	<-o.done
}

// change reads the record, edits it with edit and writes it back if no
// other process wrote in between, up to overridesTries times. edit
// reports whether it changed the map; if not, nothing is written and
// change returns false.
//
// A write whose answer is lost may have been made: if a later round finds
// the edit made already, change reports it made (a Delete retried after
// its write went through still says there was one).
func (o *Overrides) change(ctx context.Context, edit func(map[string]int) (bool, error)) (bool, error) {
	tried, waited := false, false
	for range overridesTries {
		if o.closed.Load() {
			return false, ErrClosed
		}
		rec, presumed, err := o.sync(ctx)
		switch {
		case errors.Is(err, errBadRecord):
			// What the store holds cannot be read, and this process has no
			// copy to put in its place: a change writes over it, or none
			// could ever be made.
			o.log.Error("fleet: overrides: the store's record cannot be read; a change writes over it", slog.Any("error", err))
			rec = overridesRecord{}
		case err != nil:
			return false, err
		case presumed == "":
			continue // this process wrote its copy back: read again
		case presumed == "-" && !waited && o.seen() == 0:
			// No record, and this process has seen none: the store may
			// have lost it, and a process that knew it will write it back
			// at its next read. Give it that time, once, rather than write
			// a record of this change alone over theirs.
			waited = true
			t := time.NewTimer(overridesRefresh)
			select {
			case <-ctx.Done():
				t.Stop()
				return false, ctx.Err()
			case <-t.C:
			}
			continue
		}
		m := maps.Clone(rec.Limits)
		if m == nil {
			m = map[string]int{}
		}
		changed, err := edit(m)
		if err != nil || !changed {
			return tried && err == nil, err
		}
		tried = true
		if ok, err := o.write(ctx, o.nextVersion(rec.V), presumed, m); err != nil || ok {
			return ok, err
		}
	}
	return false, ErrOverridesConflict
}

// seen returns the latest version this process has seen (0: none).
func (o *Overrides) seen() uint64 {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.version
}

// write writes limits, as version v, over the store's record of the
// version presumed, and takes it if it was written.
func (o *Overrides) write(ctx context.Context, v uint64, presumed string, limits map[string]int) (bool, error) {
	next := overridesRecord{V: v, Key: o.key, Format: overridesFormat, Limits: limits}
	state, err := json.Marshal(next)
	if err != nil {
		return false, err
	}
	if len(state) > maxOverridesBytes {
		return false, fmt.Errorf("%w: %d bytes, over %d", ErrOverridesFull, len(state), maxOverridesBytes)
	}
	res, err := o.store.SyncLearned(ctx, &driver.LearnedCall{Key: o.key, Presumed: presumed, State: string(state), TTL: overridesTTL})
	if err != nil || !res.Wrote {
		return false, err
	}
	if res.PublishErr != "" {
		o.mu.Lock()
		warn := time.Since(o.warnedAt) >= learnErrLogEvery
		if warn {
			o.warnedAt = time.Now()
		}
		o.mu.Unlock()
		if warn {
			o.log.Warn("fleet: overrides written but not published: the other processes take them at their next read",
				slog.String("error", res.PublishErr), slog.Int("bytes", len(state)))
		}
	}
	o.take(next, noRead)
	return true, nil
}

// nextVersion is the version of a write over the store's record of version
// v: over v and over any version this process has seen, and at least the
// time in microseconds, so that a process that has seen no version (one
// started after the store lost its data) still writes over the versions of
// before the loss, as far as the clocks agree.
func (o *Overrides) nextVersion(v uint64) uint64 {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return max(v+1, o.version+1, uint64(max(time.Now().UnixMicro(), 0)))
}

// errBadRecord is wrapped by read's error for a record that cannot be read.
var errBadRecord = fmt.Errorf("%w: an overrides record that cannot be read", driver.ErrBadReply)

// read reads the record, and the version a write must presume (the
// store's, also with errBadRecord).
func (o *Overrides) read(ctx context.Context) (overridesRecord, string, error) {
	res, err := o.store.SyncLearned(ctx, &driver.LearnedCall{Key: o.key, TTL: overridesTTL})
	if err != nil {
		return overridesRecord{}, "", err
	}
	if !res.Found {
		return overridesRecord{}, "-", nil
	}
	rec, err := o.decode(res.State)
	switch {
	case errors.Is(err, ErrOverridesFormat):
		return overridesRecord{}, "", err
	case err != nil || res.Version != fmt.Sprint(rec.V):
		return overridesRecord{}, res.Version, fmt.Errorf("%w: %q (version %q): %.200q", errBadRecord, o.key, res.Version, res.State)
	}
	return rec, res.Version, nil
}

// decode reads a record of this Overrides: its format first, so that a
// later one's limits, whatever their shape, are not taken for a bad record.
func (o *Overrides) decode(state string) (overridesRecord, error) {
	var head struct {
		V      uint64          `json:"v"`
		Key    string          `json:"k"`
		Format json.RawMessage `json:"f"`
		Limits json.RawMessage `json:"limits"`
	}
	if err := json.Unmarshal([]byte(state), &head); err != nil {
		return overridesRecord{}, err
	}
	if head.Key != o.key {
		return overridesRecord{}, errors.New("another record's key")
	}
	rec := overridesRecord{V: head.V, Key: head.Key, Format: formatOf(head.Format)}
	if rec.Format > overridesFormat {
		return overridesRecord{}, fmt.Errorf("%w: %q is in format %s, this process reads up to %d", ErrOverridesFormat, o.key, head.Format, overridesFormat)
	}
	if len(head.Limits) > 0 {
		if err := json.Unmarshal(head.Limits, &rec.Limits); err != nil {
			return overridesRecord{}, err
		}
	}
	return rec, nil
}

// sync reads the record and takes it, and returns it with the version a
// write must presume. If the store's record is older than this process's
// copy (the store lost its data, or failed over to a replica that lagged),
// or cannot be read, it writes the copy back and returns no presumed
// version.
func (o *Overrides) sync(ctx context.Context) (overridesRecord, string, error) {
	o.mu.RLock()
	since := o.taken
	o.mu.RUnlock()
	rec, presumed, err := o.read(ctx)
	bad := errors.Is(err, errBadRecord)
	switch {
	case bad && o.seen() == 0:
		return rec, presumed, err // nothing to put in its place
	case bad:
		o.log.Error("fleet: overrides: the store's record cannot be read; writing this process's copy over it", slog.Any("error", err))
	case err != nil:
		return rec, presumed, err
	case !o.take(rec, since):
		return rec, presumed, nil
	default:
		o.log.Error("fleet: overrides: the store's are older than this process's copy (it lost its data, or failed over to a replica that lagged); writing the copy back",
			slog.Uint64("store_version", rec.V), slog.Uint64("copy_version", o.seen()))
	}
	// The copy goes back under its own version: a process whose copy is
	// later writes its own over it at its next read, one whose copy is
	// older takes it.
	o.mu.RLock()
	mine, version := maps.Clone(o.limits), o.version
	o.mu.RUnlock()
	if _, err := o.write(ctx, version, presumed, mine); err != nil {
		return rec, presumed, err
	}
	return rec, "", nil
}

// noRead is take's since for a record that was not read: a message, or
// this process's own write.
const noRead = ^uint64(0)

// take makes rec this process's copy if it is later than every version
// seen (a message published before a change is not taken after it). A
// record read from the store (since: the count of records taken when the
// read began) of the copy's version only marks the copy synced; one older
// than the copy is left, and take reports it (restore) unless another
// record was taken while it was read.
func (o *Overrides) take(rec overridesRecord, since uint64) (restore bool) {
	o.tell.Lock()
	defer o.tell.Unlock()
	o.mu.Lock()
	read := since != noRead
	if read && rec.V == o.version && o.synced {
		o.mu.Unlock()
		return false
	}
	if rec.V < o.version || rec.V == o.version && !read {
		restore = read && o.taken == since
		o.mu.Unlock()
		return restore
	}
	o.taken++
	var changed []string
	for name, n := range rec.Limits {
		if old, ok := o.limits[name]; !ok || old != n {
			changed = append(changed, name)
		}
	}
	for name := range o.limits {
		if _, ok := rec.Limits[name]; !ok {
			changed = append(changed, name)
		}
	}
	o.limits = maps.Clone(rec.Limits)
	if o.limits == nil {
		o.limits = map[string]int{}
	}
	o.version = rec.V
	o.synced = o.synced || read
	o.mu.Unlock()
	for _, name := range changed {
		o.told(name)
	}
	return false
}

// told calls onChange for name. A panic in it is logged, with its stack,
// and goes no further: the copy holds the change, and the other names are
// told.
func (o *Overrides) told(name string) {
	if o.onChange == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			o.log.Error("fleet: overrides: onChange panicked", slog.String("name", name),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
		}
	}()
	o.onChange(name)
}

// run reads the overrides each refresh and takes what the store publishes,
// until ctx ends.
func (o *Overrides) run(ctx context.Context) {
	defer close(o.done)
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		o.store.Listen(ctx, "overrides-"+newLeaseID()[:16], overridesListener{o})
	}()
	defer func() { <-listening }()
	t := time.NewTicker(overridesRefresh)
	defer t.Stop()
	var lastErr time.Time
	for {
		rctx, cancel := context.WithTimeout(ctx, overridesRefresh)
		_, _, err := o.sync(rctx)
		cancel()
		if err != nil && ctx.Err() == nil && time.Since(lastErr) >= learnErrLogEvery {
			lastErr = time.Now()
			o.log.Warn("fleet: overrides not read; this process keeps its copy", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// overridesListener takes the records the store publishes: its own, later
// than the copy. A subscription made anew may have missed some: the next
// read, within a second, brings them.
type overridesListener struct{ o *Overrides }

func (overridesListener) Listening()     {}
func (overridesListener) Granted(string) {}
func (l overridesListener) Learned(payload string) {
	if !strings.Contains(payload, `"k":"\u0000overrides/`) {
		return // a learned cap's
	}
	rec, err := l.o.decode(payload)
	if err != nil {
		return // another's, or one the reads will tell of
	}
	l.o.take(rec, noRead)
}
