package pacing

// What an answer says it used: the "usage" of an OpenAI- or
// Anthropic-style answer, read as the body passes (WatchUsage), and the
// Transport's settling of a request's budgets with it.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"mime"
	"sync"
)

type tokensKey struct{}

// WithTokens returns a context under which a Transport admits its request
// as costing t (Gate.AcquireTokens): its prompt's tokens and the most it
// may answer, as the caller estimates them. The Transport then settles the
// request's budgets with the usage its answer reports (WatchUsage), if it
// reports one. Without it a request weighs one token and settles nothing.
func WithTokens(ctx context.Context, t Tokens) context.Context {
	return context.WithValue(ctx, tokensKey{}, t)
}

// tokensOf returns the cost ctx carries, and whether it carries one.
func tokensOf(ctx context.Context) (Tokens, bool) {
	t, ok := ctx.Value(tokensKey{}).(Tokens)
	return t, ok
}

// MaxUsageBody bounds what WatchUsage keeps to read a usage: a line of a
// stream (a longer one passes through unread), or a JSON answer's usage
// object. A JSON answer is not kept: its usage is found as it passes.
const MaxUsageBody = 1 << 20

// WatchUsage returns body, unchanged as it is read, that calls f once with
// the tokens the answer reports it used, when it has been read to its end
// (or closed after its usage came):
//   - a JSON answer (contentType other than text/event-stream): its
//     "usage" (OpenAI's prompt_tokens and completion_tokens, or
//     input_tokens and output_tokens as Anthropic and OpenAI's Responses
//     API say, with Anthropic's cache_creation_input_tokens counted as
//     input), or its message's or response's, whatever the answer's
//     length, once it has passed whole;
//   - a stream of server-sent events: the latest of each count that any
//     event's "usage" (or its message's or response's) carried. OpenAI
//     sends it in a last chunk only when the request asked for it with
//     stream_options.include_usage; Anthropic in message_start (input)
//     and message_delta (output).
//
// f is not called for an answer that reports no usage (for a stream, no
// output count of its answer: a message_start's alone is none), or that
// is closed before the end without one: its estimate stands. f runs on
// the goroutine that reads the end or closes the body; a Close that comes
// while a Read runs f returns once f has, or after 5 s (f should not
// close the body itself: that Close waits so long).
func WatchUsage(body io.ReadCloser, contentType string, f func(Tokens)) io.ReadCloser {
	mt, _, _ := mime.ParseMediaType(contentType)
	return &usageBody{rc: body, stream: mt == "text/event-stream", f: f, scan: newUsageScan()}
}

type usageBody struct {
	rc     io.ReadCloser
	stream bool
	f      func(Tokens)

	mu       sync.Mutex
	scan     usageScan // a JSON answer's
	buf      []byte    // a stream's unfinished line
	tooLong  bool      // that line outgrew MaxUsageBody
	in, out  int
	gotIn    bool
	gotOut   bool // an output count that ends the answer has come
	finished bool // f has been called, or will not be
	// reported is closed once f has returned (or panicked), if a Read
	// calls it: a Close meanwhile returns only then, so that the slot a
	// Transport frees on Close goes after the usage is settled.
	reported chan struct{}
}

func (b *usageBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	if b.finished {
		b.mu.Unlock()
		return n, err
	}
	if n > 0 {
		b.feed(p[:n])
	}
	var used Tokens
	report := false
	if err == io.EOF {
		switch {
		case !b.stream:
			b.scanned()
		case !b.tooLong:
			b.line(b.buf) // a last line with no newline
		}
		// A stream's usage is its answer's output count, as at Close: an
		// Anthropic stream cut by an error event after its message_start
		// has said nothing of its answer.
		used, report = b.finishLocked(!b.stream || b.gotOut)
	}
	if report {
		b.reported = make(chan struct{})
		defer close(b.reported)
	}
	b.mu.Unlock()
	if report {
		b.f(used)
	}
	return n, err
}

// Close closes the body; the usage counts if it came before: a JSON
// answer read whole (its last byte, if not its EOF), or a stream's usage.
func (b *usageBody) Close() error {
	err := b.rc.Close()
	b.mu.Lock()
	if !b.stream && !b.finished {
		b.scanned() // reads nothing from an answer cut short: it is no JSON
	}
	used, report := b.finishLocked(!b.stream || b.gotOut)
	reported := b.reported // a Read's report of the usage, under way or done
	b.mu.Unlock()
	if report {
		b.f(used)
	} else if reported != nil {
		awaitReport(reported)
	}
	return err
}

// feed takes the next bytes of the answer.
func (b *usageBody) feed(p []byte) {
	if !b.stream {
		b.scan.feed(p)
		return
	}
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n") // a line ends in "\n", "\r\n" or "\r": "\r\n" is two, the second empty
		if i < 0 {
			if len(b.buf)+len(p) > MaxUsageBody {
				b.tooLong, b.buf = true, b.buf[:0] // this line is skipped
			} else if !b.tooLong {
				b.buf = append(b.buf, p...)
			}
			return
		}
		if !b.tooLong {
			if len(b.buf) > 0 {
				b.buf = append(b.buf, p[:i]...)
				b.line(b.buf)
			} else {
				b.line(p[:i])
			}
		}
		b.buf, b.tooLong = b.buf[:0], false
		p = p[i+1:]
	}
}

// line reads one line of an event stream: a data line that mentions usage.
func (b *usageBody) line(l []byte) {
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if ok && bytes.Contains(data, []byte(`"usage"`)) {
		b.parse(data)
	}
}

// usageJSON is a "usage" object, in either vocabulary.
type usageJSON struct {
	PromptTokens     *int `json:"prompt_tokens"`
	CompletionTokens *int `json:"completion_tokens"`
	InputTokens      *int `json:"input_tokens"`
	OutputTokens     *int `json:"output_tokens"`
	// Anthropic's input_tokens leaves out the prompt's tokens written to
	// its cache, which its input tokens per minute count (not those read
	// from it, nor OpenAI's cached tokens, counted in prompt_tokens).
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
}

// parse reads the usage of one event of a stream, if it has one.
func (b *usageBody) parse(data []byte) {
	var v struct {
		Usage    *usageJSON                  `json:"usage"`
		Message  *struct{ Usage *usageJSON } `json:"message"`
		Response *struct{ Usage *usageJSON } `json:"response"`
	}
	if json.Unmarshal(data, &v) != nil {
		return
	}
	for i, u := range [usagePlaces]*usageJSON{nested(v.Message), v.Usage, nested(v.Response)} {
		b.apply(i, u)
	}
}

// scanned reads the usage objects a JSON answer's scan found, once the
// answer has passed whole.
func (b *usageBody) scanned() {
	if !b.scan.ended || b.scan.bad {
		return
	}
	for i, data := range b.scan.found {
		var u *usageJSON
		if data != nil && json.Unmarshal(data, &u) != nil {
			continue
		}
		b.apply(i, u)
	}
}

// apply takes the counts of a usage found at place i (inMessage, ...).
func (b *usageBody) apply(i int, u *usageJSON) {
	if u == nil {
		return
	}
	if p := cmpOr(u.PromptTokens, u.InputTokens); p != nil {
		in := max(*p, 0)
		if u.PromptTokens == nil && u.CacheCreationInputTokens != nil {
			in += min(max(*u.CacheCreationInputTokens, 0), math.MaxInt-in)
		}
		b.in, b.gotIn = in, true
	}
	if c := cmpOr(u.CompletionTokens, u.OutputTokens); c != nil {
		// A message's usage (Anthropic's message_start) comes first,
		// before the answer: its output count is not the answer's.
		b.out, b.gotOut = max(*c, 0), i != inMessage
	}
}

func nested(v *struct{ Usage *usageJSON }) *usageJSON {
	if v == nil {
		return nil
	}
	return v.Usage
}

// cmpOr returns a if it is set, else b.
func cmpOr(a, b *int) *int {
	if a != nil {
		return a
	}
	return b
}

// finishLocked ends the watch: it returns the usage read and whether to
// report it (once, if report and any was read). After it, the body only
// passes bytes through.
func (b *usageBody) finishLocked(report bool) (Tokens, bool) {
	if b.finished {
		return Tokens{}, false
	}
	b.finished, b.buf = true, nil
	return Tokens{Input: b.in, Output: b.out}, report && (b.gotIn || b.gotOut)
}
