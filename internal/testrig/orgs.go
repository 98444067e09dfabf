package testrig

import (
	"sync"
	"time"
)

// TwoOrgs is two orgs' load, sent all at once: org "large" sends Large
// requests of LargeUnits tokens spread evenly among org "small"'s Small
// requests of SmallUnits. Each request holds its tokens for Hold.
type TwoOrgs struct {
	Large, LargeUnits, Small, SmallUnits int
	Hold                                 time.Duration
}

// OrgScore is what a TwoOrgs run saw, counted apart from the cap under
// test: the most tokens in flight at once, the requests that failed, and
// the requests and tokens granted to each org within the window.
type OrgScore struct {
	Peak, Failed     int
	Requests, Tokens map[string]int
}

// Part returns org's part of what was granted to both: of the tokens, or
// with requests, of the requests.
func (s OrgScore) Part(org string, requests bool) float64 {
	by := s.Tokens
	if requests {
		by = s.Requests
	}
	return float64(by[org]) / float64(by["large"]+by["small"])
}

// Run sends o's requests, the i-th small one and the large one beside it
// acquiring their tokens with acquire(i, org, units) (which returns what
// frees them, or an error), holding them for o.Hold and freeing them; it
// counts what each org was granted in the window from the start. Run it
// in a synctest bubble.
func (o TwoOrgs) Run(window time.Duration, acquire func(i int, org string, units int) (release func(), err error)) OrgScore {
	out := OrgScore{Requests: map[string]int{}, Tokens: map[string]int{}}
	var mu sync.Mutex
	inFlight := 0
	start := time.Now()
	var wg sync.WaitGroup
	send := func(i int, org string, units int) {
		wg.Go(func() {
			release, err := acquire(i, org, units)
			mu.Lock()
			if err != nil {
				out.Failed++
				mu.Unlock()
				return
			}
			inFlight += units
			out.Peak = max(out.Peak, inFlight)
			if time.Since(start) < window {
				out.Requests[org]++
				out.Tokens[org] += units
			}
			mu.Unlock()
			time.Sleep(o.Hold) // the request's turn upstream
			mu.Lock()
			inFlight -= units
			mu.Unlock()
			release()
		})
	}
	for i := range o.Small {
		if i%(o.Small/o.Large) == 0 {
			send(i, "large", o.LargeUnits)
		}
		send(i, "small", o.SmallUnits)
	}
	wg.Wait()
	return out
}
