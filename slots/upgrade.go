package slots

import (
	"cmp"
	"context"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/inflight-go/inflight/internal/core"
)

// unusedUpgrades are the upgraded connections (101 answers) of Transports
// that nobody has used or closed yet, by their request's context's Done
// channel (also found through a context that wraps it, as a pacing
// Transport's does). httputil.ReverseProxy drops one it cannot switch to
// (the backend named another protocol; the server's ResponseWriter cannot
// be hijacked) without closing it (golang/go#80875): its slot would be held
// for good. It tells its ErrorHandler with the request whose context this
// is, and ProxyErrorHandler closes it (closeUnusedUpgrades). The list does
// not keep a body reachable: one dropped unused is still found by leak
// detection, and its entry goes with it (prune).
var unusedUpgrades struct {
	sync.Mutex
	m map[<-chan struct{}][]weak.Pointer[slotBody]
}

// droppedUpgradeWait is how long an upgraded connection of a server's
// request passed on (as a ReverseProxy does) that nobody has used is kept
// after that request's context ended (0: a second): then it is taken for
// dropped, and closed. A ReverseProxy with an ErrorHandler of the
// program's own drops one it cannot switch to, and the request ends as
// its handler returns; one it switches to is read before. A request of a
// handler's own (http.NewRequest) is not one passed on, whatever its
// context: its connection may wait unused past a handshake timeout of
// that context, as any client's. Set by tests.
var droppedUpgradeWait atomic.Int64

// listUpgrade lists b, an upgraded connection's body, under ctx until it
// is first used or ends. A context that can never end is not listed: no
// server's request has one. The request of a server passed on (passedOn:
// its RequestURI is set, which http.Client refuses, and its context is a
// server's) is closed if still unused droppedUpgradeWait after ctx ended (on
// the Transport's clock).
func (b *slotBody) listUpgrade(ctx context.Context, passedOn bool) {
	done := ctx.Done()
	if done == nil {
		return
	}
	b.ctx = ctx
	b.listed.Store(true)
	wp := weak.Make(b)
	unusedUpgrades.Lock()
	defer unusedUpgrades.Unlock()
	if unusedUpgrades.m == nil {
		unusedUpgrades.m = map[<-chan struct{}][]weak.Pointer[slotBody]{}
	}
	unusedUpgrades.m[done] = append(unusedUpgrades.m[done], wp)
	runtime.AddCleanup(b, prune, done)
	if passedOn && ctx.Value(http.ServerContextKey) != nil {
		// Without leak detection the closures keep b: collected before the
		// wait is over, its slot would be held for good. With it they do
		// not (neither reads b itself, clk is the Transport's clock): one
		// dropped is still found by leak detection.
		body := wp.Value
		if !tracked((*core.Handle)(b.s)) {
			body = func() *slotBody { return b }
		}
		clk := b.t.clock
		b.stop = context.AfterFunc(ctx, func() {
			clk.AfterFunc(cmp.Or(time.Duration(droppedUpgradeWait.Load()), time.Second), func() {
				if b := body(); b != nil && b.listed.CompareAndSwap(true, false) {
					keepListed(done, func(x weak.Pointer[slotBody]) bool { return x != wp })
					defer core.Recovered("an unused upgraded connection's Close", b.s.hold())
					_ = b.Close()
				}
			})
		})
	}
}

// prune drops the entries of done's bodies that have been collected.
func prune(done <-chan struct{}) {
	keepListed(done, func(wp weak.Pointer[slotBody]) bool { return wp.Value() != nil })
}

// unlist takes b out of the list, once: it has been used, or has ended.
func (b *slotBody) unlist() {
	if b.listed.CompareAndSwap(true, false) {
		me := weak.Make(b)
		keepListed(b.ctx.Done(), func(wp weak.Pointer[slotBody]) bool { return wp != me })
		if b.stop != nil {
			b.stop() // it is not dropped
		}
	}
}

// keepListed keeps of done's entries those for which keep holds.
func keepListed(done <-chan struct{}, keep func(weak.Pointer[slotBody]) bool) {
	unusedUpgrades.Lock()
	defer unusedUpgrades.Unlock()
	list := unusedUpgrades.m[done]
	kept := list[:0]
	for _, wp := range list {
		if keep(wp) {
			kept = append(kept, wp)
		}
	}
	if len(kept) == 0 {
		delete(unusedUpgrades.m, done)
	} else {
		unusedUpgrades.m[done] = kept
	}
}

// closeUnusedUpgrades closes the upgraded connections of ctx's request
// that nobody has used: their slots go.
func closeUnusedUpgrades(ctx context.Context) {
	done := ctx.Done()
	if done == nil {
		return
	}
	unusedUpgrades.Lock()
	list := unusedUpgrades.m[done]
	delete(unusedUpgrades.m, done)
	var bodies []*slotBody
	for _, wp := range list {
		if b := wp.Value(); b != nil && b.listed.CompareAndSwap(true, false) {
			bodies = append(bodies, b)
		}
	}
	unusedUpgrades.Unlock()
	for _, b := range bodies {
		defer b.Close() // each, also if one panics
	}
}
