package slots_test

import (
	"cmp"
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/inflight-go/inflight/slots"
)

// benchLimit is the capacity of every pool in these benchmarks.
const benchLimit = 8

// benchUnits is what one admission weighs in the weighted variants, whose
// pools hold benchLimit*benchUnits units.
const benchUnits = 3

// contenders is the number of goroutines fighting over benchLimit slots in
// BenchmarkLimiterContended: four times the capacity, so that most
// acquisitions queue and most releases hand a slot to a waiter.
const contenders = 32

// sink keeps holdWork's result observable, so the compiler cannot drop the
// work. Each goroutine writes it once, after its loop, so it adds no
// contention to the measurement.
var sink atomic.Uint64

// holdWork is the work done while holding a slot: a few dozen nanoseconds of
// register arithmetic (xorshift), identical for every implementation, so that
// holders overlap a little as they would around a real call without the
// benchmark turning into a measurement of the work itself.
func holdWork(x uint64) uint64 {
	for range 16 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

// setContenders makes the next RunParallel start contenders goroutines
// (2 cores x 16 on the reference machine). RunParallel starts
// parallelism*GOMAXPROCS goroutines, so round up.
func setContenders(b *testing.B) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((contenders + procs - 1) / procs)
}

// BenchmarkLimiterContended measures blocking Acquire and Release under
// contention: contenders goroutines share a pool of benchLimit, so the queue
// and the hand-off to waiters are on the hot path. The baselines are
// x/sync/semaphore and a buffered channel. Both are FIFO too: a receive from
// the full channel moves the first blocked sender's value into the buffer,
// so the freed slot goes to that sender and a newcomer cannot take it.
func BenchmarkLimiterContended(b *testing.B) {
	ctx := context.Background()

	// Each twice: weight 1, and weighted, each admission taking benchUnits
	// units of a pool of benchLimit*benchUnits (as many fit at once).
	for _, w := range []struct {
		suffix string
		units  int
	}{{"", 1}, {"-units", benchUnits}} {
		b.Run("inflight"+w.suffix, func(b *testing.B) {
			lim := slots.NewLimiter(benchLimit * w.units)
			b.ReportAllocs()
			setContenders(b)
			b.RunParallel(func(pb *testing.PB) {
				x := uint64(1)
				for pb.Next() {
					var s *slots.Slot
					var err error
					if w.units == 1 {
						s, err = lim.Acquire(ctx)
					} else {
						s, err = lim.AcquireN(ctx, w.units)
					}
					if err != nil {
						b.Error(err)
						return
					}
					x = holdWork(x)
					s.Release()
				}
				sink.Add(x)
			})
		})

		// xsync-handle is x/sync with the handle the Slot contract asks of
		// every admission (see BenchmarkLimiterTryAcquireRelease): the floor
		// of a limiter that hands out a *Slot, queued as x/sync queues.
		for _, handle := range []bool{false, true} {
			name := "xsync" + w.suffix
			if handle {
				name = "xsync-handle" + w.suffix
			}
			b.Run(name, func(b *testing.B) {
				sem := semaphore.NewWeighted(int64(benchLimit * w.units))
				n := int64(w.units)
				b.ReportAllocs()
				setContenders(b)
				b.RunParallel(func(pb *testing.PB) {
					x := uint64(1)
					kept := make([]*xsyncHandle, 1) // on the heap: a handle stored here escapes
					for pb.Next() {
						if err := sem.Acquire(ctx, n); err != nil {
							b.Error(err)
							return
						}
						x = holdWork(x)
						if handle {
							h := &xsyncHandle{sem: sem, n: n}
							kept[0] = h
							h.release()
						} else {
							sem.Release(n)
						}
					}
					sink.Add(x)
				})
			})
		}
	}

	// The channel semaphore and three probes built on it, in one loop so
	// that they differ only where they mean to. A send takes a slot, a
	// receive gives it back. Acquire also watches ctx.Done(), as a real
	// caller would; for Background it is nil, and a nil channel case costs
	// next to nothing.
	//
	// The probes are not targets: they show what the channel's figure is
	// made of. chan-counted adds the least bookkeeping a limiter that reports
	// its in-flight count must do, one atomic add on each side of the hold.
	// chan-handle adds the least a Slot is: a fresh handle per admission (the
	// size of a Slot, with a pointer in it) whose release is guarded against
	// a second call, with no holder list and no counts. chan-handle-first
	// makes the same handle before the send instead of after it: the work is
	// the same, only its place in the loop moves, and on the reference
	// machine that alone changes the channel's time several times over.
	for _, probe := range []struct {
		name                      string
		count, handle, allocFirst bool
	}{
		{"chan", false, false, false},
		{"chan-counted", true, false, false},
		{"chan-handle", false, true, false},
		{"chan-handle-first", false, true, true},
	} {
		b.Run(probe.name, func(b *testing.B) {
			ch := make(chan struct{}, benchLimit)
			var inFlight atomic.Int64
			b.ReportAllocs()
			setContenders(b)
			b.RunParallel(func(pb *testing.PB) {
				x := uint64(1)
				kept := make([]*probeHandle, 1) // on the heap: a handle stored here escapes
				for pb.Next() {
					var h *probeHandle
					if probe.allocFirst {
						h = &probeHandle{sem: ch}
						kept[0] = h
					}
					select {
					case ch <- struct{}{}:
					case <-ctx.Done():
						b.Error(ctx.Err())
						return
					}
					if probe.handle && !probe.allocFirst {
						h = &probeHandle{sem: ch}
						kept[0] = h
					}
					if probe.count {
						inFlight.Add(1)
					}
					x = holdWork(x)
					if probe.count {
						inFlight.Add(-1)
					}
					if h != nil {
						h.release()
					} else {
						<-ch
					}
				}
				sink.Add(x)
			})
		})
	}
}

// probeHandle is the chan-handle probe's Slot: 48 bytes, like a Slot.
type probeHandle struct {
	released atomic.Bool
	sem      chan struct{}
	_        [4]uint64
}

func (h *probeHandle) release() {
	if h.released.CompareAndSwap(false, true) {
		<-h.sem
	}
}

// BenchmarkLimiterTryAcquireRelease measures the uncontended fast path: one
// goroutine, TryAcquire then Release, so the pool is always empty. This is
// the fixed cost a request pays when the limit does not bind.
//
// xsync-handle is a probe, not a target: x/sync's semaphore plus the least
// that the Slot contract asks of every admission, a fresh handle (the size
// of a Slot, with a pointer in it) whose release is guarded against a
// second call. A handle cannot be reused, since a late second Release of
// the old holder would free the new holder's slot; so this probe is the
// floor of any limiter that hands out a *Slot, and the distance between it
// and xsync is the contract's price, not the engine's.
func BenchmarkLimiterTryAcquireRelease(b *testing.B) {
	b.Run("inflight", func(b *testing.B) {
		lim := slots.NewLimiter(benchLimit)
		b.ReportAllocs()
		for b.Loop() {
			s, err := lim.TryAcquire()
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
		}
	})

	b.Run("inflight-units", func(b *testing.B) {
		lim := slots.NewLimiter(benchLimit * benchUnits)
		b.ReportAllocs()
		for b.Loop() {
			s, err := lim.TryAcquireN(benchUnits)
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
		}
	})

	b.Run("xsync", func(b *testing.B) {
		sem := semaphore.NewWeighted(benchLimit)
		b.ReportAllocs()
		for b.Loop() {
			if !sem.TryAcquire(1) {
				b.Fatal("semaphore full")
			}
			sem.Release(1)
		}
	})

	b.Run("xsync-handle", func(b *testing.B) {
		sem := semaphore.NewWeighted(benchLimit)
		kept := make([]*xsyncHandle, 1) // on the heap: a handle stored here escapes
		b.ReportAllocs()
		for b.Loop() {
			if !sem.TryAcquire(1) {
				b.Fatal("semaphore full")
			}
			h := &xsyncHandle{sem: sem}
			kept[0] = h
			h.release()
		}
	})

	b.Run("chan", func(b *testing.B) {
		ch := make(chan struct{}, benchLimit)
		b.ReportAllocs()
		for b.Loop() {
			select {
			case ch <- struct{}{}:
			default:
				b.Fatal("channel full")
			}
			<-ch
		}
	})
}

// xsyncHandle is the xsync-handle probes' Slot: 48 bytes, like a Slot.
type xsyncHandle struct {
	released atomic.Bool
	sem      *semaphore.Weighted
	n        int64 // units held; 0 is 1
	_        [3]uint64
}

func (h *xsyncHandle) release() {
	if h.released.CompareAndSwap(false, true) {
		h.sem.Release(max(h.n, 1))
	}
}

// BenchmarkLimiterRefusal: a TryAcquire refused by a full Limiter of 1,000
// slots, each refusal told its Retry-After and booked among the returns
// told (a flood: past the bound of eight rounds, the list at its 1,024),
// against x/sync's semaphore saying false, which tells nothing.
func BenchmarkLimiterRefusal(b *testing.B) {
	b.Run("inflight", func(b *testing.B) {
		lim := slots.NewLimiter(1000)
		for range 1000 {
			if _, err := lim.TryAcquire(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := lim.TryAcquire(); err == nil {
				b.Fatal("admitted")
			}
		}
	})
	b.Run("xsync", func(b *testing.B) {
		sem := semaphore.NewWeighted(1000)
		if !sem.TryAcquire(1000) {
			b.Fatal("semaphore busy")
		}
		b.ReportAllocs()
		for b.Loop() {
			if sem.TryAcquire(1) {
				b.Fatal("admitted")
			}
		}
	})
}

// BenchmarkCombinedRelease: three Slots held as one (Combine, as pacing's
// Transport holds a provider's, a fleet's and a token cap's), against the
// same three released one by one: what the combined hold costs, its
// release past a part's panic included.
func BenchmarkCombinedRelease(b *testing.B) {
	lims := []*slots.Limiter{slots.NewLimiter(benchLimit), slots.NewLimiter(benchLimit), slots.NewLimiter(benchLimit)}
	acquire := func(b *testing.B) (x, y, z *slots.Slot) {
		x, err1 := lims[0].TryAcquire()
		y, err2 := lims[1].TryAcquire()
		z, err3 := lims[2].TryAcquire()
		if err := cmp.Or(err1, err2, err3); err != nil {
			b.Fatal(err)
		}
		return x, y, z
	}
	b.Run("combined", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			slots.Combine(acquire(b)).Release()
		}
	})
	b.Run("one-by-one", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			x, y, z := acquire(b)
			x.Release()
			y.Release()
			z.Release()
		}
	})
}
