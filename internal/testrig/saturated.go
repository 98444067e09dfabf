package testrig

import (
	"sync"
	"sync/atomic"
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
