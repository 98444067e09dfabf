package slots

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// WrapBody returns a body that releases s once, at its first Close, Read
// error, io.EOF, WriteTo's end or panic (closing body first on a Close or
// failed Read). It keeps body's WriteTo, Write and CloseWrite; one with
// Write and CloseWrite (a connection) is open until closed: its io.EOF says
// only that the peer is done sending. A nil or http.NoBody body frees s at
// once.
func WrapBody(body io.ReadCloser, s *Slot) io.ReadCloser {
	if s == nil {
		return body
	}
	if body == nil || body == http.NoBody {
		s.releaseQuietly()
		return body
	}
	rc, _ := newSlotBody(body, s, nil)
	return rc
}

// newSlotBody wraps body, keeping its io.Writer, io.WriterTo and (with
// io.Writer) CloseWrite, and returns the wrapper along with its slotBody. t
// is the Transport whose response body it is, or nil for WrapBody.
func newSlotBody(body io.ReadCloser, s *Slot, t *Transport) (io.ReadCloser, *slotBody) {
	_, writable := body.(io.Writer)
	_, writerTo := body.(io.WriterTo)
	_, closeWriter := body.(closeWriter)
	switch {
	case writable && writerTo && closeWriter:
		w := &closeWriterWriterToBody{writableWriterToBody{writerToBody{slotBody{rc: body, s: s, t: t, conn: true}}}}
		return w, &w.slotBody
	case writable && closeWriter:
		w := &closeWriterBody{writableBody{slotBody{rc: body, s: s, t: t, conn: true}}}
		return w, &w.slotBody
	case writable && writerTo:
		w := &writableWriterToBody{writerToBody{slotBody{rc: body, s: s, t: t}}}
		return w, &w.slotBody
	case writable:
		w := &writableBody{slotBody{rc: body, s: s, t: t}}
		return w, &w.slotBody
	case writerTo:
		w := &writerToBody{slotBody{rc: body, s: s, t: t}}
		return w, &w.slotBody
	}
	b := &slotBody{rc: body, s: s, t: t}
	return b, b
}

// copied is a response handed out as a copy of the base's (out), which
// takes base's Trailer when its body has been read to its end.
type copied struct {
	out  http.Response
	base *http.Response
}

// takeTrailer gives the copy handed out the base's Trailer, once its body
// has met its end on the reader's goroutine (where net/http sets it), as
// net/http does: merged into one the caller set, if any.
func (b *slotBody) takeTrailer() {
	c := b.copied
	if c == nil || c.base.Trailer == nil {
		return
	}
	if c.out.Trailer == nil {
		c.out.Trailer = c.base.Trailer
		return
	}
	for k, vv := range c.base.Trailer { // a no-op when it is the base's own map
		c.out.Trailer[k] = vv
	}
}

// An ending says how a body ended, which decides when its slot goes.
type ending uint8

const (
	endClean ending = iota // read to its end: the upstream has finished the answer
	endCut                 // closed before its end, its context ended, or a read failed
	endPanic               // a method of the wrapped body panicked
)

type slotBody struct {
	rc io.ReadCloser
	s  *Slot
	// t is the Transport that sent the request, or nil (WrapBody). With a
	// Transport, a cut keeps the slot for the Transport's linger.
	t *Transport
	// stop ends the Transport's watch of the request's context (for an
	// upgraded connection, the check that it was not dropped unused:
	// upgrade.go); nil when there is none. It is set before the body is
	// handed out, but the watch itself may already run while it is being
	// set, so the watch's end never reads it (end checks fromWatch first).
	// The check's Close reads it after taking the list's lock, which
	// listUpgrade holds while setting it.
	stop func() bool
	// ctx is the request's context, when the Transport watches it, or
	// when the body is an upgraded connection (which it does not watch).
	ctx context.Context

	// copied is the response handed out in place of the base's (leak
	// detection: RoundTrip), or nil.
	copied *copied

	// conn marks a connection (a 101's, or a body with Write and
	// CloseWrite): its reading side's end is not the connection's, so only
	// Close ends it. Set before the body is handed out.
	conn bool

	watchCut  atomic.Bool // the watch closed rc because ctx ended
	drained   atomic.Bool // a conn's reading side reached its end: a Close then is no cut
	ended     atomic.Bool // the slot's release has been decided
	listed    atomic.Bool // an upgraded connection nobody has used yet (upgrade.go)
	closeOnce sync.Once   // rc is closed once, and a second closer waits for the first
	closeErr  error       // rc's Close error, written inside closeOnce
}

// end decides, once, that the body is over, and gives the slot back: at
// once, or after the Transport's linger for a cut. fromWatch says the call
// comes from the context watch.
func (b *slotBody) end(e ending, fromWatch bool) {
	if !b.ended.CompareAndSwap(false, true) {
		return
	}
	if b.listed.Load() {
		b.unlist()
	}
	if !fromWatch && b.stop != nil {
		b.stop()
	}
	if b.t == nil {
		b.s.releaseQuietly()
		return
	}
	b.t.free(b.s, e == endCut)
}

// closeBody closes rc once; a concurrent caller returns only when rc's
// Close has.
func (b *slotBody) closeBody() error {
	b.closeOnce.Do(func() { b.closeErr = b.rc.Close() })
	return b.closeErr
}

// cut closes rc and then ends the body: the slot never goes back while the
// connection it stands for may still be open on this side.
func (b *slotBody) cut(fromWatch bool) error {
	returned := false
	defer func() {
		if !returned {
			b.end(endPanic, fromWatch)
		}
	}()
	err := b.closeBody()
	returned = true
	if b.drained.Load() {
		b.end(endClean, fromWatch)
	} else {
		b.end(endCut, fromWatch)
	}
	return err
}

// drain ends a body read to its end, or notes it for a conn, which stays
// open until closed.
func (b *slotBody) drain() {
	if b.conn {
		b.drained.Store(true)
		return
	}
	b.end(endClean, false)
}

// watch is the Transport's reaction to the end of the request's context.
// The end of the context frees the slot whatever the body does: if its
// Close has not returned within cutCloseWait (it waits for a Read stuck
// on a silent upstream, say), the slot goes all the same.
// It runs on a goroutine of its own, where a panic in the body's Close
// would end the process: it is logged (core.Recovered), once cut has
// freed the slot.
func (b *slotBody) watch() {
	defer core.Recovered("the watch of a request's context", b.s.hold())
	b.watchCut.Store(true)
	late := b.t.clock.AfterFunc(cutCloseWait, func() {
		defer core.Recovered("a slow Close's timer", b.s.hold())
		b.end(endCut, true)
	})
	defer late.Stop()
	_ = b.cut(true)
}

// cutCloseWait bounds how long the end of a request's context waits for
// the response body's Close before the slot goes back anyway.
const cutCloseWait = 5 * time.Second

func (b *slotBody) Read(p []byte) (n int, err error) {
	if b.listed.Load() {
		b.unlist()
	}
	returned := false
	defer func() {
		if !returned {
			b.broken()
		}
	}()
	n, err = b.rc.Read(p)
	returned = true
	if err != nil && err != io.EOF && b.watchCut.Load() {
		// A read that met the watch's Close fails as net/http fails one
		// cut by the context, with the context's cause: a reader such as
		// httputil.ReverseProxy then knows the client went away, and does
		// not log the closed body as a read error.
		err = context.Cause(b.ctx)
	}
	switch {
	case err == io.EOF:
		b.takeTrailer()
		b.drain()
	case err != nil:
		_ = b.cut(false) // the exchange is broken: let the connection go first
	}
	return n, err
}

func (b *slotBody) Close() error { return b.cut(false) }

// broken ends a body whose Read (or WriteTo) panicked, a wrapper's on the
// way, say: the exchange is broken, so rc is closed before the slot goes
// (as by cut), and the slot goes even if that Close panics too.
func (b *slotBody) broken() {
	defer b.end(endPanic, false)
	_ = b.closeBody()
}

// writerToBody keeps the body's WriteTo, which io.Copy prefers.
type writerToBody struct{ slotBody }

// WriteTo copies the body to w. It releases the slot when the body has been
// read to its end (a conn's: see drain); when it stops early (w failed)
// the slot stays held until Close, as the body may still be open.
func (b *writerToBody) WriteTo(w io.Writer) (n int64, err error) {
	if b.listed.Load() {
		b.unlist()
	}
	returned := false
	defer func() {
		if !returned {
			b.broken()
		}
	}()
	n, err = b.rc.(io.WriterTo).WriteTo(w)
	returned = true
	if err == nil {
		b.takeTrailer()
		b.drain()
	}
	return n, err
}

// writableBody keeps Write, for the connection of an upgraded response.
type writableBody struct{ slotBody }

func (b *writableBody) Write(p []byte) (int, error) {
	if b.listed.Load() {
		b.unlist()
	}
	return b.rc.(io.Writer).Write(p)
}

// writableWriterToBody keeps both, as for a raw network connection.
type writableWriterToBody struct{ writerToBody }

func (b *writableWriterToBody) Write(p []byte) (int, error) {
	if b.listed.Load() {
		b.unlist()
	}
	return b.rc.(io.Writer).Write(p)
}

// closeWriter is an upgraded connection that can be half-closed, as
// net/http's is: httputil.ReverseProxy half-closes the backend's once the
// client has, and without it tears both down before the backend's last
// words come. A half-close does not free the slot.
type closeWriter interface{ CloseWrite() error }

type closeWriterBody struct{ writableBody }

func (b *closeWriterBody) CloseWrite() error { return b.rc.(closeWriter).CloseWrite() }

type closeWriterWriterToBody struct{ writableWriterToBody }

func (b *closeWriterWriterToBody) CloseWrite() error { return b.rc.(closeWriter).CloseWrite() }
