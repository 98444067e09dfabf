// Package sweep watches what holds a registry's or a Limiter's capacity and
// reports it: how many slots are in use, the busiest key, and the holders
// kept longer than a threshold (each reported once). It never frees a slot:
// time is not a reason to take capacity from a live holder, so a slot held
// for hours is a report, not a reclaim.
//
//	m := sweep.New(reg, sweep.WithThreshold(30*time.Minute), sweep.WithObserver(metrics))
//	defer m.Stop()
//
// A Monitor holds only a weak pointer to what it watches: it never keeps a
// registry alive, and its goroutine ends by itself at the first tick after
// the registry has been collected. Stop ends it at once.
//
// A sweep walks one lock shard at a time (Registry.HoldersInShard), so it
// never holds the whole registry while it walks: an admission waits at most
// for the copy of one shard's holders.
package sweep

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
	"weak"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Defaults.
const (
	DefaultInterval  = 60 * time.Second
	DefaultThreshold = 30 * time.Minute
)

// Held is one holder kept longer than the threshold.
type Held[K comparable] struct {
	Key        K
	ID         uint64
	AcquiredAt time.Time
	HeldFor    time.Duration
}

// Report is what one sweep saw.
type Report[K comparable] struct {
	At    time.Time
	InUse int // holders, summed over keys (a multi-key slot counts per key)
	// Units is the units they hold, summed over keys: what the caps count
	// (Stats.InFlight), and InUse when every slot weighs 1.
	Units      int
	Keys       int // keys with at least one holder
	MaxPerKey  int // the most units held under one key
	BusiestKey K   // a key with MaxPerKey units held; the zero K when nothing is held
	// LongHeld lists the holders over the threshold, per key;
	// NewlyLongHeld those of them not reported by an earlier sweep, once
	// per slot.
	LongHeld      []Held[K]
	NewlyLongHeld []Held[K]

	over int // distinct slots in LongHeld
}

// Tick is the part of a Report that metrics want: totals, no key labels.
type Tick struct {
	InUse         int
	Units         int
	Keys          int
	MaxPerKey     int
	OverThreshold int // slots held over the threshold now (a multi-key slot once)
	NewlyOver     int // of them, those seen over it for the first time
	// Stopped marks the last Tick, with no counts: the Monitor has ended
	// (Stop, or its source was collected), and what it told is stale.
	Stopped bool
}

// An Observer receives a Tick after each sweep of a running Monitor, and a
// last one (Tick.Stopped) when the Monitor ends. It is called from the
// Monitor's goroutine, without any lock held; a panic in it is recovered
// and logged, and the next tick is delivered as usual.
type Observer interface {
	ObserveSweep(Tick)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Tick)

// ObserveSweep calls f.
func (f ObserverFunc) ObserveSweep(t Tick) { f(t) }

// An Option configures a Monitor; a nil one is ignored.
type Option interface{ apply(*config) }

// optionFunc adapts a function to Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	interval  time.Duration
	threshold time.Duration
	clock     clock.Clock
	logger    *slog.Logger
	observer  Observer
}

// WithInterval sets how often the Monitor sweeps (default 60 s). It panics
// if d <= 0.
func WithInterval(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("sweep: WithInterval(%v): the interval must be positive", d))
	}
	return optionFunc(func(c *config) { c.interval = d })
}

// WithThreshold sets how long a slot may be held before it is reported
// (default 30 min). It panics if d <= 0.
func WithThreshold(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("sweep: WithThreshold(%v): the threshold must be positive", d))
	}
	return optionFunc(func(c *config) { c.threshold = d })
}

// WithClock sets the clock of the ticks; for tests. The default (and nil)
// is the real clock.
func WithClock(c clock.Clock) Option {
	if c == nil {
		c = clock.New()
	}
	return optionFunc(func(cfg *config) { cfg.clock = c })
}

// WithLogger sets the logger for long-held warnings (key and slot id, never
// request content) and observer panics. nil (the default) means
// slog.Default(), looked up each time. Keys appear as fmt prints them: key
// a registry by an API key's id, never by the key itself.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// WithObserver sets the Observer of each tick.
func WithObserver(o Observer) Option { return optionFunc(func(c *config) { c.observer = o }) }

// Monitor sweeps a registry or a Limiter on a timer. Create it with New or
// NewForLimiter; the zero value is not usable.
type Monitor[K comparable] struct {
	cfg config
	// walk visits the source's holders shard by shard; it reports false
	// once the source has been collected. It holds a weak pointer only.
	walk func(visit func([]registry.Holder[K])) bool

	mu       sync.Mutex // serialises sweeps; protects reported
	reported map[uint64]struct{}

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// New starts a Monitor of reg. The Monitor keeps only a weak pointer to reg.
func New[K comparable](reg *registry.Registry[K], opts ...Option) *Monitor[K] {
	wp := weak.Make(reg)
	return start(func(visit func([]registry.Holder[K])) bool {
		r := wp.Value()
		if r == nil {
			return false
		}
		var buf []registry.Holder[K]
		for i := range r.Shards() {
			buf = r.HoldersInShard(i, buf[:0])
			visit(buf)
		}
		return true
	}, opts)
}

// NewForLimiter starts a Monitor of l, whose holders all have the key "".
// The Monitor keeps only a weak pointer to l.
func NewForLimiter(l *slots.Limiter, opts ...Option) *Monitor[string] {
	wp := weak.Make(l)
	return start(func(visit func([]registry.Holder[string])) bool {
		lim := wp.Value()
		if lim == nil {
			return false
		}
		visit(limiterHolders(lim))
		return true
	}, opts)
}

func start[K comparable](walk func(func([]registry.Holder[K])) bool, opts []Option) *Monitor[K] {
	cfg := config{interval: DefaultInterval, threshold: DefaultThreshold, clock: clock.New()}
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.apply(&cfg)
	}
	m := &Monitor[K]{cfg: cfg, walk: walk, stop: make(chan struct{}), done: make(chan struct{})}
	ticker := cfg.clock.Ticker(cfg.interval) // made here, so a test's clock sees it at once
	go m.run(ticker)
	return m
}

// Stop ends the Monitor's goroutine and waits for it, which gives the
// Observer its last Tick (Tick.Stopped) first. It is safe to call more than
// once and after the Monitor has ended by itself, but not from the
// Observer, which runs on that goroutine, nor holding a lock it takes.
func (m *Monitor[K]) Stop() {
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.done
}

// Done is closed when the Monitor's goroutine has ended: after Stop, or once
// its source has been collected.
func (m *Monitor[K]) Done() <-chan struct{} { return m.done }

// run sweeps at each tick. The first sweep comes one interval after start;
// a tick that finds the previous sweep still running is dropped, not queued.
func (m *Monitor[K]) run(t *clock.Ticker) {
	defer close(m.done)
	defer m.observe(Tick{Stopped: true}) // before Stop returns
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			rep, ok := m.sweep(now)
			if !ok {
				return // the source is gone
			}
			m.warn(rep)
			m.observe(Tick{InUse: rep.InUse, Units: rep.Units, Keys: rep.Keys, MaxPerKey: rep.MaxPerKey,
				OverThreshold: rep.over, NewlyOver: len(rep.NewlyLongHeld)})
		}
	}
}

// Sweep walks the source now and returns what it saw, as if a tick had come
// at now: holders over the threshold at now are reported, the new ones once.
// It does not call the Observer. Once the source has been collected it
// returns an empty report.
func (m *Monitor[K]) Sweep(now time.Time) Report[K] {
	rep, _ := m.sweep(now)
	return rep
}

func (m *Monitor[K]) sweep(now time.Time) (Report[K], bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rep := Report[K]{At: now}
	perKey := make(map[K]int)
	stillLong := make(map[uint64]struct{}, len(m.reported))
	over := 0 // distinct slots over the threshold
	ok := m.walk(func(hs []registry.Holder[K]) {
		for _, h := range hs {
			rep.InUse++
			rep.Units += h.Units
			perKey[h.Key] += h.Units
			held := now.Sub(h.AcquiredAt)
			if held < m.cfg.threshold {
				if _, before := m.reported[h.ID]; before {
					// Reported by a sweep whose now was later (a manual
					// Sweep between a tick and its sweep): keep it
					// reported.
					stillLong[h.ID] = struct{}{}
				}
				continue
			}
			lh := Held[K]{Key: h.Key, ID: h.ID, AcquiredAt: h.AcquiredAt, HeldFor: held}
			rep.LongHeld = append(rep.LongHeld, lh)
			_, before := m.reported[h.ID]
			_, metAlready := stillLong[h.ID] // a multi-key slot is met once per key
			if !metAlready {
				over++
				if !before {
					rep.NewlyLongHeld = append(rep.NewlyLongHeld, lh)
				}
			}
			stillLong[h.ID] = struct{}{}
		}
	})
	if !ok {
		return Report[K]{At: now}, false
	}
	// Only reported holders still held are remembered, so the set stays as
	// small as what is held.
	m.reported = stillLong
	rep.over = over
	rep.Keys = len(perKey)
	for k, n := range perKey {
		if n > rep.MaxPerKey {
			rep.MaxPerKey, rep.BusiestKey = n, k
		}
	}
	return rep, true
}

func (m *Monitor[K]) log() *slog.Logger {
	if m.cfg.logger != nil {
		return m.cfg.logger
	}
	return slog.Default()
}

func (m *Monitor[K]) warn(rep Report[K]) {
	for _, h := range rep.NewlyLongHeld {
		m.log().Warn("sweep: slot held longer than the threshold",
			slog.String("key", fmt.Sprint(h.Key)), slog.Uint64("slot_id", h.ID),
			slog.Duration("held_for", h.HeldFor.Round(time.Second)),
			slog.Duration("threshold", m.cfg.threshold))
	}
}

func (m *Monitor[K]) observe(t Tick) {
	if m.cfg.observer == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			m.log().Error("sweep: observer panicked", slog.Any("panic", p))
		}
	}()
	m.cfg.observer.ObserveSweep(t)
}
