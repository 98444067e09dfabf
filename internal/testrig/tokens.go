package testrig

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// LargePrompts is a self-hosted server's load: Large prompts of LargeUnits
// tokens among Small ones of 1,000 to 3,000 tokens, all sent at once in a
// random order, behind a cap of Cache tokens in flight. A large one holds
// its tokens for LargeHold, a small one for SmallHold.
type LargePrompts struct {
	Cache, Large, LargeUnits, Small int
	LargeHold, SmallHold            time.Duration
}

// TokenScore is what a LargePrompts run saw, counted apart from the cap
// under test.
type TokenScore struct {
	Served, Failed int
	Peak           int           // the most tokens in flight at once
	SmallDone      time.Duration // when the last small request ended
	LargeStart     time.Duration // when the last large request started
	// SmallShare is the share of the token-seconds the large requests
	// left free, while small requests waited, that small ones used (once
	// none waits, what they leave free is no want of throughput). Idle is
	// the token-seconds the cache stood idle while small requests waited.
	SmallShare, Idle float64
}

// IdleBound is the cost strict order may have: a large request at the
// head of the queue waits for the requests before it to end, the cache
// idling for at most its tokens over the longest hold of those (a small
// one's, as no more than Cache/LargeUnits large ones fit at once) plus
// slack, the time a freed room takes to reach it.
func (l LargePrompts) IdleBound(slack time.Duration) float64 {
	return float64(l.Large) * float64(l.LargeUnits) * (l.SmallHold + slack).Seconds()
}

// LargeStartBound is when the last large request must have started if
// no large one is kept waiting by lighter ones more than a bounded time:
// Cache/LargeUnits of them fit at once, so they start in rounds, and each
// round waits for the round before it (LargeHold) and for small requests
// let in before it or past it (two SmallHolds).
func (l LargePrompts) LargeStartBound() time.Duration {
	perRound := max(l.Cache/l.LargeUnits, 1)
	rounds := (l.Large + perRound - 1) / perRound
	return time.Duration(rounds-1)*(l.LargeHold+2*l.SmallHold) + 2*l.SmallHold
}

type tokenEvent struct {
	at    time.Time
	delta int
	large bool
}

// Run sends l's requests at once, the i-th acquiring its tokens with
// acquire(i, units) (which returns what frees them, or an error), holding
// them for its hold and freeing them; it returns what it counted once
// every request ended. Run it in a synctest bubble to score it, or on a
// real clock to count what must hold on any machine (Peak, Served).
func (l LargePrompts) Run(acquire func(i, units int) (release func(), err error)) TokenScore {
	rng := rand.New(rand.NewPCG(7, 8))
	type req struct {
		n    int
		hold time.Duration
	}
	reqs := make([]req, 0, l.Small+l.Large)
	for range l.Small {
		reqs = append(reqs, req{1000 + rng.IntN(2001), l.SmallHold})
	}
	for range l.Large {
		reqs = append(reqs, req{l.LargeUnits, l.LargeHold})
	}
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })

	var mu sync.Mutex
	var out TokenScore
	var events []tokenEvent
	waitingSmall := l.Small
	var waits []time.Time // when the count of small ones waiting changed, and to what
	var waitCounts []int
	inFlight := 0
	note := func(n int, large bool) {
		inFlight += n
		out.Peak = max(out.Peak, inFlight)
		events = append(events, tokenEvent{time.Now(), n, large})
	}
	begin := time.Now()
	var wg sync.WaitGroup
	for i, r := range reqs {
		large := r.n == l.LargeUnits
		wg.Go(func() {
			release, err := acquire(i, r.n)
			mu.Lock()
			if !large {
				waitingSmall--
				waits, waitCounts = append(waits, time.Now()), append(waitCounts, waitingSmall)
			}
			if err != nil {
				out.Failed++
				mu.Unlock()
				return
			}
			out.Served++
			if large {
				out.LargeStart = max(out.LargeStart, time.Since(begin))
			}
			note(r.n, large)
			mu.Unlock()
			time.Sleep(r.hold) // the server's work
			mu.Lock()
			note(-r.n, large)
			mu.Unlock()
			release()
		})
	}
	wg.Wait()

	slices.SortStableFunc(events, func(a, b tokenEvent) int { return a.at.Compare(b.at) })
	waitingAt := func(t time.Time) int { // small ones waiting just after t
		i, _ := slices.BinarySearchFunc(waits, t, func(a, t time.Time) int { return a.Compare(t.Add(1)) })
		if i == 0 {
			return l.Small
		}
		return waitCounts[i-1]
	}
	var end time.Time
	for _, e := range events {
		if !e.large && e.delta < 0 {
			end = e.at
		}
	}
	var free, used float64
	large, small := 0, 0
	at := begin
	for _, e := range events {
		if e.at.After(end) {
			break
		}
		d := e.at.Sub(at).Seconds()
		if waitingAt(at) > 0 {
			free += float64(l.Cache-large) * d
			used += float64(small) * d
			out.Idle += float64(l.Cache-large-small) * d
		}
		at = e.at
		if e.large {
			large += e.delta
		} else {
			small += e.delta
		}
	}
	out.SmallDone = end.Sub(begin)
	if free > 0 {
		out.SmallShare = used / free
	}
	return out
}

// HeavyAmongLight measures how long a caller of 5 units waits among 10
// closed-loop callers of one unit under a cap of 10 (run it in a synctest
// bubble): each light caller takes its unit for hold and comes back at
// once, staggered by hold/10, for 30 s; the heavy one comes at 0.55 hold.
// acquire(n) returns what frees the n units it took, or an error (which
// fails a light caller and ends it).
func HeavyAmongLight(t testing.TB, hold time.Duration, acquire func(n int) (release func(), err error)) time.Duration {
	end := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * hold / 10)
			for time.Now().Before(end) {
				release, err := acquire(1)
				if err != nil {
					t.Errorf("a light caller: %v", err)
					return
				}
				time.Sleep(hold) // its work
				release()
			}
		})
	}
	time.Sleep(hold * 55 / 100)
	start := time.Now()
	release, err := acquire(5)
	waited := time.Since(start)
	if err != nil {
		t.Errorf("the heavy caller: %v", err)
	} else {
		release()
	}
	wg.Wait()
	return waited
}
