package memstore

import (
	"context"
	"sync"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

type eventKind uint8

const (
	listening eventKind = iota
	granted
	learnedState
)

type event struct {
	kind    eventKind
	payload string
}

// sub is one Listen: the events for its process, queued without bound so
// that the store never waits for a listener.
type sub struct {
	proc string
	mu   sync.Mutex
	evs  []event
	more chan struct{} // buffered 1: evs has events
}

func (x *sub) send(e event) {
	x.mu.Lock()
	x.evs = append(x.evs, e)
	x.mu.Unlock()
	select {
	case x.more <- struct{}{}:
	default:
	}
}

func (x *sub) take() []event {
	x.mu.Lock()
	defer x.mu.Unlock()
	evs := x.evs
	x.evs = nil
	return evs
}

// publish queues e for proc's listeners (a grant) or every listener (a
// learned state), in the order of the calls that publish: call it with
// s.mu held (queuing never waits).
func (s *Store) publish(proc string, e event) {
	for x := range s.subs {
		if e.kind != granted || x.proc == proc {
			x.send(e)
		}
	}
}

// Listen delivers to l the grants made to proc's tickets and the learned
// states published, until ctx ends. While the store is killed it hears
// nothing; Restart tells it Listening anew.
func (s *Store) Listen(ctx context.Context, proc string, l driver.Listener) {
	x := &sub{proc: proc, more: make(chan struct{}, 1)}
	s.mu.Lock()
	s.subs[x] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, x)
		s.mu.Unlock()
	}()
	l.Listening()
	for {
		select {
		case <-ctx.Done():
			return
		case <-x.more:
		}
		for _, e := range x.take() {
			switch e.kind {
			case listening:
				l.Listening()
			case granted:
				l.Granted(e.payload)
			case learnedState:
				l.Learned(e.payload)
			}
		}
	}
}
