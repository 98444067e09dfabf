package slots

import (
	"io"
	"net/http"
)

// WrapBody returns a body that reads from body and releases s on the first
// of: Close, a Read that returns io.EOF or any other error, or (for a body
// with WriteTo) a WriteTo that reaches the end. The slot is released once,
// whichever comes first and from whichever goroutine; Read and Close may
// run concurrently as far as body allows.
//
// The wrapper keeps body's io.WriterTo, and keeps io.Writer for a body that
// has it: the body of a 101 Switching Protocols response is the upgraded
// connection, and httputil.ReverseProxy refuses one that is not writable.
// A nil body and http.NoBody release s at once and are returned as they are.
// A nil s wraps nothing: body is returned as it is.
func WrapBody(body io.ReadCloser, s *Slot) io.ReadCloser {
	return wrapBody(body, s, nil)
}

// wrapBody is WrapBody that also calls done (if not nil) once the body is
// finished with: Transport uses it to stop watching the request's context.
func wrapBody(body io.ReadCloser, s *Slot, done func() bool) io.ReadCloser {
	if s == nil {
		return body
	}
	if body == nil || body == http.NoBody {
		s.releaseQuietly()
		if done != nil {
			done()
		}
		return body
	}
	b := slotBody{rc: body, s: s, done: done}
	_, writable := body.(io.Writer)
	_, writerTo := body.(io.WriterTo)
	switch {
	case writable && writerTo:
		return &writableWriterToBody{writerToBody{b}}
	case writable:
		return &writableBody{b}
	case writerTo:
		return &writerToBody{b}
	}
	return &b
}

type slotBody struct {
	rc   io.ReadCloser
	s    *Slot
	done func() bool // may be nil
}

func (b *slotBody) finish() {
	b.s.releaseQuietly()
	if b.done != nil {
		b.done()
	}
}

func (b *slotBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *slotBody) Close() error {
	err := b.rc.Close()
	b.finish()
	return err
}

// writerToBody keeps the body's WriteTo, which io.Copy prefers.
type writerToBody struct{ slotBody }

// WriteTo copies the body to w. It releases the slot when the body has been
// read to its end; when it stops early (w failed) the slot stays held until
// Close, as the body may still be open.
func (b *writerToBody) WriteTo(w io.Writer) (int64, error) {
	n, err := b.rc.(io.WriterTo).WriteTo(w)
	if err == nil {
		b.finish()
	}
	return n, err
}

// writableBody keeps Write, for the connection of an upgraded response.
type writableBody struct{ slotBody }

func (b *writableBody) Write(p []byte) (int, error) { return b.rc.(io.Writer).Write(p) }

// writableWriterToBody keeps both, as for a raw network connection.
type writableWriterToBody struct{ writerToBody }

func (b *writableWriterToBody) Write(p []byte) (int, error) { return b.rc.(io.Writer).Write(p) }
