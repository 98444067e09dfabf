package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
// change. The store publishes it: the other processes read it as soon as
// the message arrives, and in any case at their next read, every second.
// (A message only makes them read: another fleet of the same name on
// another installation may share the channels, as Redis's databases share
// its pub/sub and the schemas of a PostgreSQL database its NOTIFY.)
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
// that has seen no overrides waits two seconds before its first change to a
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

	// read asks the background loop to read the record now (see
	// overridesListener).
	readNow chan struct{}

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

// overridesWriteBack is how long a process that has seen no overrides
// waits before its first change to a store that has none, so that the
// processes that knew them write them back first: each begins a read every
// overridesRefresh, and the read with its write-back may take as long
// again (its timeout). A process that waited one refresh only wrote the
// record of its change alone over theirs when their store answered slowly.
const overridesWriteBack = 2 * overridesRefresh

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
		limits: map[string]int{}, readNow: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}),
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
			t := time.NewTimer(overridesWriteBack)
			select {
			case <-ctx.Done():
				t.Stop()
				return false, ctx.Err()
			case <-t.C:
			}
			continue
		}
		if rec.V < o.seen() {
			// Older than this process's copy, and not written back: the
			// store lost its data (or failed over to a replica that
			// lagged) as another read of this process took a later
			// record. A change made on it would be the latest record, of
			// the store's old overrides alone, and every process would
			// take it: read again, which writes the copy back.
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
