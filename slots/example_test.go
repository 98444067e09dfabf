package slots_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/inflight-go/inflight/slots"
)

func ExampleLimiter() {
	// At most two requests to the upstream at once.
	lim := slots.NewLimiter(2)

	a, _ := lim.Acquire(context.Background())
	b, _ := lim.Acquire(context.Background())
	fmt.Println("in flight:", lim.InFlight())

	// A third caller that must not wait is turned away, with the numbers an
	// HTTP layer needs for a 429.
	_, err := lim.TryAcquire()
	var le *slots.LimitError
	if errors.As(err, &le) {
		fmt.Println(errors.Is(err, slots.ErrLimitReached), le.InFlight, le.Limit, le.RetryAfter)
	}

	a.Release()
	a.Release() // a second release does nothing
	b.Release()
	fmt.Println("in flight:", lim.InFlight())
	// Output:
	// in flight: 2
	// true 2 2 1s
	// in flight: 0
}

func ExampleWithFailOpen() {
	// Wait at most 30 s for a slot, then proceed without one rather than
	// stall every caller behind a hung upstream.
	lim := slots.NewLimiter(8, slots.WithMaxWait(30*time.Second), slots.WithFailOpen())

	s, err := lim.Acquire(context.Background())
	if err != nil {
		return
	}
	defer s.Release()
	fmt.Println("bypassed:", s.Bypassed())
	// Output: bypassed: false
}

func ExampleLimiter_SetLimit() {
	lim := slots.NewLimiter(1)
	s, _ := lim.TryAcquire()

	lim.SetLimit(0) // lowering never takes a slot from its holder
	fmt.Println(lim.InFlight(), lim.Limit())
	s.Release()

	lim.SetLimit(slots.Unlimited)
	s, err := lim.TryAcquire()
	fmt.Println(err)
	s.Release()
	// Output:
	// 1 0
	// <nil>
}

func ExampleNewTransport() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"delta\":\"hi\"}\n\ndata: [DONE]\n\n")
	}))
	defer upstream.Close()

	// At most 8 requests in flight to the provider; a streamed answer keeps
	// its slot until its body is read to the end or closed.
	lim := slots.NewLimiter(8)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) {
		return lim.Acquire(r.Context())
	})}

	resp, err := client.Get(upstream.URL + "/v1/chat/completions")
	if err != nil {
		return
	}
	fmt.Println("while streaming:", lim.InFlight())
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("after the stream:", lim.InFlight())

	// A model listing puts no load on the provider: it takes no slot.
	ctx := slots.WithoutSlot(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+"/v1/models", nil)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
	}
	fmt.Println("admitted in all:", lim.Stats().Acquired)
	// Output:
	// while streaming: 1
	// after the stream: 0
	// admitted in all: 1
}

func ExampleMiddleware() {
	lim := slots.NewLimiter(0) // full: every request is turned away
	handler := slots.Middleware(func(r *http.Request) (*slots.Slot, error) {
		return lim.TryAcquire()
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "served")
	}))

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
	fmt.Println(rec.Code, rec.Header().Get("Retry-After"))
	fmt.Print(rec.Body.String())
	// Output:
	// 429 1
	// {"error":{"type":"rate_limit_error","message":"too many requests in flight: 0 of 0, 0 queued (limit reached)"}}
}

func ExampleWrapBody() {
	lim := slots.NewLimiter(1)
	s, _ := lim.TryAcquire()

	// The slot lives as long as the body: it is released by the read that
	// reaches the end (or by Close, or by a read error).
	body := slots.WrapBody(io.NopCloser(strings.NewReader("a long answer")), s)
	fmt.Println(lim.InFlight())
	io.Copy(io.Discard, body)
	fmt.Println(lim.InFlight())
	body.Close() // closing as well is fine
	// Output:
	// 1
	// 0
}

func ExampleWithObserver() {
	var acquired, released int
	lim := slots.NewLimiter(2, slots.WithObserver(slots.ObserverFunc(func(e slots.Event) {
		switch e.Kind {
		case slots.EventAcquired:
			acquired++
		case slots.EventReleased:
			released++
		}
	})))
	s, _ := lim.TryAcquire()
	s.Release()
	fmt.Println(acquired, released)
	// Output: 1 1
}

// tracedOnly keeps the Events of traced requests alone. An Observer with
// Enabled is asked before each Event is built, with the admission's
// context (nil for releases), so those it declines cost almost nothing.
// Both methods may be called concurrently.
type tracedOnly struct {
	mu   sync.Mutex
	seen []string
}

type tracedKey struct{}

func (o *tracedOnly) Enabled(ctx context.Context) bool {
	return ctx != nil && ctx.Value(tracedKey{}) != nil
}

func (o *tracedOnly) Observe(e slots.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch e.Kind {
	case slots.EventAcquired:
		o.seen = append(o.seen, "acquired")
	case slots.EventRejected:
		o.seen = append(o.seen, "rejected")
	}
}

// An Observer that wants some Events only.
func ExampleObserver_enabled() {
	obs := &tracedOnly{}
	lim := slots.NewLimiter(1, slots.WithObserver(obs), slots.WithMaxQueue(0))
	traced := context.WithValue(context.Background(), tracedKey{}, "req-1")

	held, _ := lim.Acquire(context.Background()) // not traced: not built
	_, err := lim.Acquire(traced)                // traced, refused
	held.Release()                               // a release: declined
	s, _ := lim.Acquire(traced)                  // traced, admitted
	s.Release()
	fmt.Println(err != nil, obs.seen)
	// Output: true [rejected acquired]
}

// Interactive callers go before batch ones, and within a class flows (here
// orgs) take turns. (WithShare would keep batch a minimum share.)
func ExampleWithPriority() {
	lim := slots.NewLimiter(1)
	busy, _ := lim.TryAcquire() // the one slot is taken

	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	queue := func(name string, p slots.Priority, org string) {
		ctx := slots.WithFlow(slots.WithPriority(context.Background(), p), org)
		waiting := lim.Waiting()
		wg.Go(func() {
			s, err := lim.Acquire(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			s.Release()
		})
		for lim.Waiting() == waiting { // until it has queued
			runtime.Gosched()
		}
	}
	queue("batch a1", slots.PriorityBatch, "org-a")
	queue("batch a2", slots.PriorityBatch, "org-a")
	queue("batch b1", slots.PriorityBatch, "org-b")
	queue("interactive c1", slots.PriorityInteractive, "org-c")
	q := lim.Queue()
	fmt.Println("waiting:", q.Waiting, "batch:", q.Batch, "interactive:", q.Interactive)

	busy.Release()
	wg.Wait()
	fmt.Println(order)
	// Output:
	// waiting: 4 batch: 3 interactive: 1
	// [interactive c1 batch a1 batch b1 batch a2]
}
