// Package slotstest checks, at the end of a test, that nothing is left
// holding or waiting for a slot: the goleak of slots.
//
//	func TestClient(t *testing.T) {
//		lim := slots.NewLimiter(8)
//		defer slotstest.VerifyLimiter(t, lim)
//		...
//	}
//
// A release may still be on its way when the test body returns (a response
// body closed by another goroutine, a context's end seen by a watcher), so
// the checks retry for a short while, as goleak does, before they fail.
// Eventually does the same for a check of your own; package
// registry/registrytest checks a Registry.
//
// A Recorder keeps the events an Observer is told, for a test that checks
// what its metrics or traces would see.
package slotstest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inflight-go/inflight/slots"
)

// TB is the part of testing.TB the checks use.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
}

// Patience is how long the checks wait for stragglers before they fail.
const Patience = 2 * time.Second

// VerifyLimiter fails t, listing what remains, unless l has no holder and no
// waiter (within Patience).
func VerifyLimiter(t TB, l *slots.Limiter) {
	t.Helper()
	Eventually(t, func() string {
		st := l.Stats()
		if st.InFlight == 0 && st.Waiting == 0 {
			return ""
		}
		var b strings.Builder
		fmt.Fprintf(&b, "slotstest: limiter has %d held and %d waiting", st.InFlight, st.Waiting)
		now := time.Now()
		for _, h := range l.Holders(nil) {
			fmt.Fprintf(&b, "\n\tslot %d held for %v", h.ID, now.Sub(h.AcquiredAt).Round(time.Millisecond))
		}
		return b.String()
	})
}

// Eventually fails t with check's last report unless check reports ""
// within Patience. check describes what is left ("" for nothing); it is
// called again, after a short pause, while it reports something.
func Eventually(t TB, check func() string) {
	t.Helper()
	if msg := settle(check); msg != "" {
		t.Errorf("%s", msg)
	}
}

// settle calls check until it reports nothing or Patience has passed, and
// returns its last report.
func settle(check func() string) string {
	deadline := time.Now().Add(Patience)
	for wait := time.Microsecond; ; wait = min(2*wait, 50*time.Millisecond) {
		msg := check()
		if msg == "" || time.Now().After(deadline) {
			return msg
		}
		time.Sleep(wait) // like goleak: stragglers are other goroutines' work
	}
}

// Recorder is a slots.Observer that keeps every Event it is told, for a
// test to read: pass it to slots.WithObserver (or fleet.WithObserver). The
// zero value is ready; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []slots.Event
}

// Observe implements slots.Observer.
func (r *Recorder) Observe(e slots.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// Events returns the events told so far, oldest first.
func (r *Recorder) Events() []slots.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Kinds returns the kinds of the events told so far, oldest first.
func (r *Recorder) Kinds() []slots.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	kinds := make([]slots.EventKind, len(r.events))
	for i, e := range r.events {
		kinds[i] = e.Kind
	}
	return kinds
}
