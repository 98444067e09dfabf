package fleet

// The overrides' side of the store: the record and its format, the writes,
// the reads, and how a process takes a record into its copy.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"runtime/debug"
	"strings"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/driver"
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
	if head.V == math.MaxUint64 {
		// No version is over it: a change written on it would wrap
		// around, older than the copy that read it.
		return overridesRecord{}, errors.New("a version no other follows")
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
// version; an older record is returned as read if another record was
// taken while it was read (the next read writes the copy back).
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
	// A read of the copy's version with the copy's limits only confirms
	// it. With other limits, the store holds another record of that
	// version (a write lost in a failover to a replica that lagged, and
	// another made on the replica over the same record, while the
	// versions ran ahead of the clocks): the store's is taken, the one the
	// other processes read, or this one would keep its own until the next
	// change and neither copy would ever be written over.
	if read && rec.V == o.version && o.synced && maps.Equal(rec.Limits, o.limits) {
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
		case <-o.readNow:
		}
	}
}

// overridesListener reads the record at once when the store publishes one
// of its key later than the copy. It does not take the published record:
// a channel may carry another store's (the same fleet and key in another
// Redis database, or another schema of the database), which the epoch
// that guards learned caps cannot tell apart here. A subscription made
// anew may have missed some: the next read, within a second, brings them.
type overridesListener struct{ o *Overrides }

func (overridesListener) Listening()     {}
func (overridesListener) Granted(string) {}
func (l overridesListener) Learned(payload string) {
	if !strings.Contains(payload, `"k":"\u0000overrides/`) {
		return // a learned cap's
	}
	rec, err := l.o.decode(payload)
	if err != nil || rec.V <= l.o.seen() {
		return // another's, one the reads will tell of, or one taken
	}
	select {
	case l.o.readNow <- struct{}{}:
	default: // a read is asked for already
	}
}
