package testrig

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Saturated is what clients that honour a saturated server's Retry-After
// saw (see Saturate).
type Saturated struct {
	Requests, GaveUp                 int
	FirstRefused, FirstRetryAdmitted int
	WaitingMoments, SlotFreeMoments  int
	Told                             []time.Duration // every Retry-After told
}

// Add adds o's counts to s.
func (s *Saturated) Add(o Saturated) {
	s.Requests += o.Requests
	s.GaveUp += o.GaveUp
	s.FirstRefused += o.FirstRefused
	s.FirstRetryAdmitted += o.FirstRetryAdmitted
	s.WaitingMoments += o.WaitingMoments
	s.SlotFreeMoments += o.SlotFreeMoments
	s.Told = append(s.Told, o.Told...)
}

// FirstRetries is the share of first retries admitted, and Free the share
// of the moments clients waited out a Retry-After while a slot was free.
func (s Saturated) FirstRetries() float64 {
	return float64(s.FirstRetryAdmitted) / float64(max(s.FirstRefused, 1))
}

func (s Saturated) Free() float64 {
	return float64(s.SlotFreeMoments) / float64(max(s.WaitingMoments, 1))
}

// Saturate runs clients clients, each sending requests requests one after
// another: client c's attempt either is admitted (it returns once its turn
// is over) or is refused with a Retry-After, which the client waits out
// before it sends again, at most 5 times. Every 10 ms, while some client
// waits out a Retry-After, it notes whether a slot is free (free). Run it
// in a synctest bubble.
func Saturate(clients, requests int, attempt func(c int) (admitted bool, retryAfter time.Duration), free func() bool) Saturated {
	var out Saturated
	var mu sync.Mutex
	var sleeping atomic.Int32
	done := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for range requests {
				for refusals := 0; ; refusals++ {
					ok, after := attempt(c)
					mu.Lock()
					switch {
					case ok && refusals == 1:
						out.FirstRetryAdmitted++
					case !ok && refusals == 0:
						out.FirstRefused++
					}
					if !ok {
						out.Told = append(out.Told, after)
					}
					gaveUp := !ok && refusals == 5
					if gaveUp {
						out.GaveUp++
					}
					if ok || gaveUp {
						out.Requests++
					}
					mu.Unlock()
					if ok || gaveUp {
						break
					}
					sleeping.Add(1)
					time.Sleep(after)
					sleeping.Add(-1)
				}
			}
		})
	}
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if sleeping.Load() > 0 {
				f := free()
				mu.Lock()
				out.WaitingMoments++
				if f {
					out.SlotFreeMoments++
				}
				mu.Unlock()
			}
		}
	}()
	wg.Wait()
	close(done)
	<-sampled // its last moment counted, and no write after the return
	return out
}

// Turns returns turns of 1 s, give or take 10%, drawn from seed: the
// holds of Saturate's clients. Safe for concurrent use.
func Turns(seed uint64) func() time.Duration {
	rng := rand.New(rand.NewPCG(seed, 1))
	var mu sync.Mutex
	return func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return time.Duration((0.9 + 0.2*rng.Float64()) * float64(time.Second))
	}
}

// ScoreReturns checks runs of Saturate against the goals of a Retry-After
// that clients can trust: each run finished its requests (requests of
// them), and together at least 80% of first retries were admitted, no
// request was given up, and a slot was free in at most 20% of the moments
// clients waited. It logs the figures.
func ScoreReturns(t testing.TB, requests int, runs []Saturated) {
	t.Helper()
	var sum Saturated
	for i, r := range runs {
		if r.Requests != requests {
			t.Errorf("run %d: %d requests done, want %d", i, r.Requests, requests)
		}
		sum.Add(r)
	}
	first, free := sum.FirstRetries(), sum.Free()
	t.Logf("%d requests: %d refused at first, %d of them admitted at their first retry (%.0f%%); %d gave up; a slot free in %.1f%% of %d moments clients waited",
		sum.Requests, sum.FirstRefused, sum.FirstRetryAdmitted, 100*first, sum.GaveUp, 100*free, sum.WaitingMoments)
	if first < 0.8 {
		t.Errorf("%.1f%% of first retries admitted, want at least 80%%", 100*first)
	}
	if sum.GaveUp != 0 {
		t.Errorf("%d requests given up, want none", sum.GaveUp)
	}
	if free > 0.2 {
		t.Errorf("a slot free in %.1f%% of the moments clients waited, want at most 20%%", 100*free)
	}
}
