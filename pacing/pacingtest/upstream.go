// Package pacingtest is a simulated model provider for scoring a pacing
// Gate's settings, the learned cap above all, in virtual time: run it
// inside testing/synctest.Test and minutes of traffic take seconds.
//
//	synctest.Test(t, func(t *testing.T) {
//		res := pacingtest.Score(pacingtest.Drop, cfg) // cfg: a pacing.Config
//		t.Log(res)
//	})
//
// The Upstream has a hidden concurrency cap that follows a schedule, may
// carry another client's requests on the same account, and refuses a request
// over its cap with a 429 in a provider's shape, with Retry-After, after a
// delay that may vary as a network's does.
package pacingtest

import (
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ServiceHeader is the request header that says how long the Upstream
// streams its answer, as a Go duration ("2.5s"); DefaultService without it.
const ServiceHeader = "X-Service-Time"

// DefaultService is the service time of a request that does not say.
const DefaultService = time.Second

// Step sets the hidden cap from At (since Start) on.
type Step struct {
	At  time.Duration
	Cap int
}

// Shape is the form of a refusal's body.
type Shape uint8

const (
	// ZAI: {"error":{"code":"1302","message":"Rate limit reached for requests"}},
	// as Z.ai answers an account over its concurrency.
	ZAI Shape = iota
	// Plain: {"error":{"message":"too many concurrent requests"}}.
	Plain
)

// Upstream is the simulated provider; an http.RoundTripper that serves
// without sockets. Set its fields, then call Start; they must not change
// afterwards. The zero value has no cap.
type Upstream struct {
	Schedule []Step // the hidden cap over time; none: no cap
	// Foreign is how many requests of another client on the same account
	// are always in flight: they count against the cap.
	Foreign int
	// RetryAfter is the refusal's Retry-After, in whole seconds; 1 s when
	// zero.
	RetryAfter time.Duration
	// RefusalDelay is how long a refusal takes to arrive; 50 ms when zero.
	RefusalDelay time.Duration
	// RefusalSigma spreads the refusals' times as a network does: each
	// takes RefusalDelay·e^(RefusalSigma·Z), Z drawn from a standard
	// normal, so RefusalDelay is their median (at 0.75, a tenth take over
	// 2.6 times it); 0: each takes RefusalDelay.
	RefusalSigma float64
	// Seed seeds the draws of RefusalSigma.
	Seed uint64
	// HeaderDelay is how long an admitted request's headers take (the time
	// to the first token), at most its service time; 300 ms when zero.
	HeaderDelay time.Duration
	// EndDelay is how long after the provider has let go of an answered
	// request its client sees the end: the last bytes still on their way.
	// Meanwhile the provider counts the request no longer, while the
	// client still holds its slot, as over a real network; 0: none.
	EndDelay time.Duration
	Shape    Shape

	mu     sync.Mutex // protects the fields below
	t0     time.Time
	rng    *rand.Rand
	open   int
	counts Counts
}

// Counts is what the Upstream has seen.
type Counts struct {
	Attempts int // requests that arrived
	Refused  int // answered 429
	Served   int // streamed to the end
	// Work is the service time of the requests served: the capacity put
	// to use, which unlike Served does not depend on which requests a
	// limiter happened to let through.
	Work time.Duration
	Peak int // most open at once, the other client's included
}

// Start starts the schedule's clock.
func (u *Upstream) Start() {
	u.mu.Lock()
	u.t0 = time.Now()
	u.rng = rand.New(rand.NewPCG(u.Seed, 0x2545f4914f6cdd1d))
	u.mu.Unlock()
}

// Cap returns the hidden cap now (0: none).
func (u *Upstream) Cap() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.capLocked(time.Since(u.t0))
}

func (u *Upstream) capLocked(since time.Duration) int {
	c := 0
	for _, s := range u.Schedule {
		if s.At <= since {
			c = s.Cap
		}
	}
	return c
}

// Counts returns the counts now.
func (u *Upstream) Counts() Counts {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts
}

// RoundTrip answers req: a 429 if the account has its cap open already,
// else a 200 whose body ends after the request's service time. The request
// holds its place at the provider until its body ends or is closed.
func (u *Upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	service := DefaultService
	if s := req.Header.Get(ServiceHeader); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d >= 0 {
			service = d
		}
	}
	u.mu.Lock()
	u.counts.Attempts++
	c := u.capLocked(time.Since(u.t0))
	refused := c > 0 && u.open+u.Foreign >= c
	refusal := or(u.RefusalDelay, 50*time.Millisecond)
	if refused {
		u.counts.Refused++
		if u.RefusalSigma > 0 && u.rng != nil {
			refusal = time.Duration(float64(refusal) * math.Exp(u.RefusalSigma*u.rng.NormFloat64()))
		}
	} else {
		u.open++
		u.counts.Peak = max(u.counts.Peak, u.open+u.Foreign)
	}
	u.mu.Unlock()

	start := time.Now()
	if refused {
		sleep(req, refusal)
		return u.refusal(req), nil
	}
	sleep(req, min(or(u.HeaderDelay, 300*time.Millisecond), service))
	resp := &http.Response{
		StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"text/event-stream"}},
		Request: req, ContentLength: -1,
		Body: &stream{u: u, req: req, end: start.Add(service), service: service},
	}
	return resp, nil
}

func (u *Upstream) refusal(req *http.Request) *http.Response {
	body := `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`
	if u.Shape == Plain {
		body = `{"error":{"message":"too many concurrent requests"}}`
	}
	ra := or(u.RetryAfter, time.Second)
	return &http.Response{
		StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Retry-After":  {strconv.Itoa(int((ra + time.Second - 1) / time.Second))},
		},
		Request: req, ContentLength: int64(len(body)),
		Body: io.NopCloser(strings.NewReader(body)),
	}
}

// stream is an admitted answer: it ends at end, or when closed or its
// request's context ends.
type stream struct {
	u       *Upstream
	req     *http.Request
	end     time.Time
	service time.Duration
	once    sync.Once
	done    bool
}

func (s *stream) Read(p []byte) (int, error) {
	if s.done {
		return 0, io.EOF
	}
	if !sleep(s.req, time.Until(s.end)) {
		s.finish(false)
		return 0, s.req.Context().Err()
	}
	s.done = true
	s.finish(true)
	sleep(s.req, s.u.EndDelay)
	return 0, io.EOF
}

func (s *stream) Close() error {
	s.finish(false)
	return nil
}

func (s *stream) finish(served bool) {
	s.once.Do(func() {
		s.u.mu.Lock()
		s.u.open--
		if served {
			s.u.counts.Served++
			s.u.counts.Work += s.service
		}
		s.u.mu.Unlock()
	})
}

// sleep waits d or until req's context ends, and reports which: true for d.
func sleep(req *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-req.Context().Done():
		return false
	}
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
