package pacing

// Asking a stream for its usage (WithStreamUsage): OpenAI sends a
// stream's usage only to a request that asks for it, so a Transport whose
// budgets settle with usage asks on the client's behalf, and keeps the
// usage chunk from a client that did not ask.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// WithStreamUsage makes a Transport ask each streamed request admitted
// under WithTokens for its usage, when its JSON body does not ask already
// ("stream": true without stream_options.include_usage, as OpenAI's API
// reads it; an upstream that does not know the field may refuse it, so
// this is for OpenAI-compatible upstreams), so that its budgets are
// settled with what it used rather than with its estimate. The client,
// who did not ask, gets the stream without the chunk that carries the
// usage alone (and without a Content-Length, which no longer holds). The
// body is read into memory to be rewritten, before the request waits for
// admission, if its Content-Type is JSON (or not given) and it is at most
// MaxModelBody; other bodies are sent as they came.
func WithStreamUsage() TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.streamUsage = true })
}

// askUsageOf returns req, or a copy that asks for the stream's usage if
// it is a streamed request that does not, and whether it asked.
func askUsageOf(req *http.Request) (*http.Request, bool, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, false, nil
	}
	if ct := req.Header.Get("Content-Type"); ct != "" {
		if mt, _, _ := mime.ParseMediaType(ct); mt != "application/json" {
			return req, false, nil
		}
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, MaxModelBody+1))
	if err != nil {
		req.Body.Close()
		return nil, false, fmt.Errorf("pacing: reading the request body: %w", err)
	}
	out := req.Clone(req.Context())
	if len(buf) > MaxModelBody { // sent as it came: what was read, then the rest
		out.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
		return out, false, nil
	}
	req.Body.Close()
	asked := false
	if b, ok := askUsage(buf); ok {
		buf, asked = b, true
	}
	out.Body = io.NopCloser(bytes.NewReader(buf))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	out.ContentLength = int64(len(buf))
	return out, asked, nil
}

// askUsage returns body asking for its stream's usage
// (stream_options.include_usage true), and true, for a JSON body that
// streams ("stream": true) and does not ask: include_usage left out,
// false or null. The body's other fields are kept (its keys in sorted
// order). Any other body gets false.
func askUsage(body []byte) ([]byte, bool) {
	var v map[string]json.RawMessage
	if json.Unmarshal(body, &v) != nil || string(v["stream"]) != "true" {
		return nil, false
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := v["stream_options"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &opts) != nil {
			return nil, false // not an object: the upstream will say so
		}
	}
	if raw, ok := opts["include_usage"]; ok && string(raw) != "false" && string(raw) != "null" {
		return nil, false // asked by the client: its usage chunk is its own
	}
	opts["include_usage"] = json.RawMessage("true")
	v["stream_options"], _ = json.Marshal(opts)
	out, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return out, true
}

// dropUsage takes the usage chunk out of resp's body if it is a stream
// of server-sent events.
func dropUsage(resp *http.Response) {
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return
	}
	resp.Body = &usageDropper{rc: resp.Body, r: bufio.NewReader(resp.Body)}
	// A short stream may come with its length (net/http sets it for a
	// handler that ends before it flushes): it no longer holds.
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
}

// usageDropper passes a stream of server-sent events through, event by
// event, without the chunk that carries only the usage (no choices). An
// event longer than maxHeldEvent cannot be that chunk: what was read of
// it is passed on, and the rest as it comes.
type usageDropper struct {
	rc      io.ReadCloser
	r       *bufio.Reader
	pending []byte // the rest of an event being passed on
	passing bool   // within an event too long to hold: passed on as read
	midLine bool   // and within one of its lines
	afterCR bool   // the last line ended in a "\r" last of what was read: a "\n" may follow
	dropped bool   // the last event was dropped: so is the "\n" of its last "\r\n", read apart
	err     error
}

// maxHeldEvent bounds the event a usageDropper holds to look at whole: a
// usage chunk is some hundred bytes.
const maxHeldEvent = 64 << 10

func (d *usageDropper) Read(p []byte) (int, error) {
	for len(d.pending) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		ev, lead, ended, err := d.readEvent()
		d.err = err
		d.dropped = !d.passing && ended && usageOnly(ev[lead:])
		if d.dropped {
			ev = ev[:lead] // the end of the event before, passed on as it was
		}
		d.pending = ev
		d.passing = !ended
	}
	n := copy(p, d.pending)
	d.pending = d.pending[n:]
	return n, nil
}

func (d *usageDropper) Close() error { return d.rc.Close() }

// readEvent reads one event, or the rest of one: its lines up to and
// including the blank line that ends it (or what is left at the end of
// the stream), and reports whether it ended; past maxHeldEvent bytes it
// returns what it read, not ended. The "\n" of a "\r\n" that ended what
// was read before, read apart from its "\r", goes as that went: its first
// lead bytes (0 or 1) if that was passed on, nowhere if it was dropped.
func (d *usageDropper) readEvent() (ev []byte, lead int, ended bool, err error) {
	for {
		line, tail, err := d.readLine()
		if tail && len(ev) == 0 {
			if d.dropped {
				continue
			}
			lead = len(line)
		}
		ev = append(ev, line...)
		switch {
		case tail: // the end of the line before
		case err == bufio.ErrBufferFull:
			d.midLine = true // what follows is the end of this line
		default:
			blank := !d.midLine && len(bytes.TrimRight(line, "\r\n")) == 0
			d.midLine = false
			if err != nil || blank {
				return ev, lead, true, err
			}
		}
		if len(ev) > maxHeldEvent {
			return ev, lead, false, nil
		}
	}
}

// readLine reads one line through its end: "\n", "\r\n" or a lone "\r",
// as an event stream may end its lines; or, with bufio.ErrBufferFull, the
// part of a longer one that fills the buffer. tail says that the line is
// the "\n" of a "\r\n" whose "\r" ended the line before, read apart.
// The line is valid until the next read, as bufio.Reader.ReadSlice's.
func (d *usageDropper) readLine() (line []byte, tail bool, err error) {
	buf, err := d.r.Peek(1)
	if err != nil {
		return nil, false, err
	}
	if d.afterCR {
		d.afterCR = false
		if buf[0] == '\n' {
			d.r.Discard(1)
			return buf, true, nil
		}
	}
	for {
		buf, _ = d.r.Peek(d.r.Buffered())
		if i := bytes.IndexAny(buf, "\r\n"); i >= 0 {
			n := i + 1
			if buf[i] == '\r' && n < len(buf) && buf[n] == '\n' {
				n++
			} else if buf[i] == '\r' && n == len(buf) {
				d.afterCR = true // its "\n", if one follows, is not read yet
			}
			d.r.Discard(n)
			return buf[:n], false, nil
		}
		if len(buf) == d.r.Size() {
			d.r.Discard(len(buf))
			return buf, false, bufio.ErrBufferFull
		}
		if _, err = d.r.Peek(len(buf) + 1); err != nil { // the stream's end
			buf, _ = d.r.Peek(d.r.Buffered())
			d.r.Discard(len(buf))
			return buf, false, err
		}
	}
}

// usageOnly reports whether an event is a chunk of usage alone:
// data {"choices":[], "usage":{...}}.
func usageOnly(ev []byte) bool {
	if !bytes.Contains(ev, []byte(`"usage"`)) {
		return false
	}
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexAny(ev, "\r\n"); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		var v struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   json.RawMessage   `json:"usage"`
		}
		return json.Unmarshal(data, &v) == nil && len(v.Choices) == 0 && len(v.Usage) > 0 && string(v.Usage) != "null"
	}
	return false
}
