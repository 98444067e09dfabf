package pacing

import (
	"bufio"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The usage chunk asked for is taken out of the stream, event by event,
// and nothing else is.
func TestUsageDropper(t *testing.T) {
	in := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n" +
		": a comment\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	want := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n: a comment\n\ndata: [DONE]\n\n"
	d := &usageDropper{rc: io.NopCloser(strings.NewReader(in))}
	d.r = bufio.NewReaderSize(d.rc, 16) // events longer than its buffer
	got, err := io.ReadAll(d)
	require.NoError(t, err)
	assert.Equal(t, want, string(got))
	require.NoError(t, d.Close())
}

// Events read a byte at a time, CRLF line ends and comments pass whole;
// only the usage chunk is taken out.
func TestUsageDropperSplitReads(t *testing.T) {
	for _, le := range []string{"\n", "\r\n", "\r"} {
		usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}" + le + le
		in := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\r\n\r\n" +
			": keepalive" + le + le +
			"event: chunk" + le + usage +
			"data: [DONE]" + le + le
		want := strings.Replace(in, "event: chunk"+le+usage, "", 1) // the whole event
		src := io.NopCloser(iotest.OneByteReader(strings.NewReader(in)))
		d := &usageDropper{rc: src, r: bufio.NewReader(src)}
		got, err := io.ReadAll(iotest.OneByteReader(d))
		require.NoError(t, err)
		assert.Equal(t, want, string(got), "line end %q", le)
	}
}

// An event is passed on as soon as it is whole, not held until the next.
func TestUsageDropperLatency(t *testing.T) {
	pr, pw := io.Pipe()
	d := &usageDropper{rc: pr, r: bufio.NewReader(pr)}
	go pw.Write([]byte("data: {\"choices\":[{}]}\n\n"))
	got := make(chan string, 1)
	go func() {
		p := make([]byte, 4096)
		n, _ := d.Read(p)
		got <- string(p[:n])
	}()
	select {
	case s := <-got:
		assert.Equal(t, "data: {\"choices\":[{}]}\n\n", s)
	case <-time.After(time.Second):
		t.Fatal("the event is held back until the next")
	}
	pw.Close()
}

// A line of exactly the reader's buffer: the newline after it ends the
// line, not the event.
func TestUsageDropperBufferBoundary(t *testing.T) {
	line := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2},\"pad\":\""
	line += strings.Repeat("x", 4096-len(line)-2) + "\"}"
	require.Len(t, line, 4096)
	in := line + "\n\ndata: [DONE]\n\n"
	src := io.NopCloser(strings.NewReader(in))
	d := &usageDropper{rc: src, r: bufio.NewReader(src)}
	got, err := io.ReadAll(d)
	require.NoError(t, err)
	assert.Equal(t, "data: [DONE]\n\n", string(got))
}

// An event longer than the dropper holds is passed on as it comes, before
// its end, and is never taken for the usage chunk, however it ends; the
// events after it are judged as before.
func TestUsageDropperLongEvent(t *testing.T) {
	pr, pw := io.Pipe()
	d := &usageDropper{rc: pr, r: bufio.NewReader(pr)}
	long := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1},\"pad\":\"" + strings.Repeat("x", 3*maxHeldEvent)
	go func() {
		pw.Write([]byte(long)) // no end yet
	}()
	first := make([]byte, 4096)
	n, err := io.ReadFull(d, first)
	require.NoError(t, err, "passed on before the event ends")
	assert.Equal(t, long[:n], string(first[:n]))
	usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n"
	go func() {
		pw.Write([]byte("\"}\n\n" + usage + "data: [DONE]\n\n"))
		pw.Close()
	}()
	rest, err := io.ReadAll(d)
	require.NoError(t, err)
	assert.Equal(t, long+"\"}\n\ndata: [DONE]\n\n", string(first[:n])+string(rest), "the long one whole, the usage chunk after it dropped")
}

// chunked gives its parts one per Read, as a network gives what arrived.
type chunked struct{ parts []string }

func (c *chunked) Read(p []byte) (int, error) {
	for len(c.parts) > 0 && c.parts[0] == "" {
		c.parts = c.parts[1:]
	}
	if len(c.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.parts[0])
	c.parts[0] = c.parts[0][n:]
	return n, nil
}

func (c *chunked) Close() error { return nil }

func newDropper(parts ...string) *usageDropper {
	src := &chunked{parts: parts}
	return &usageDropper{rc: src, r: bufio.NewReader(src)}
}

// A usage chunk whose closing "\r\n" comes in two reads ("\r" last of
// one, "\n" first of the next) is dropped whole. Before, its "\n" was
// taken for the start of the next event and passed on.
func TestUsageDropperDropsASplitCRLF(t *testing.T) {
	d := newDropper("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\r\n\r",
		"\ndata: [DONE]\r\n\r\n")
	got, err := io.ReadAll(d)
	require.NoError(t, err)
	assert.Equal(t, "data: [DONE]\r\n\r\n", string(got))
}

// An event passed on whose closing "\r\n" comes in two reads, before the
// usage chunk: its "\n" is passed on with it. Before, it was taken for the
// start of the usage chunk and dropped with it.
func TestUsageDropperPassesASplitCRLF(t *testing.T) {
	content := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n"
	d := newDropper(content[:len(content)-1],
		"\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\r\n\r\n",
		"data: [DONE]\r\n\r\n")
	got, err := io.ReadAll(d)
	require.NoError(t, err)
	assert.Equal(t, content+"data: [DONE]\r\n\r\n", string(got))
}

// Streams of events with lines ended at random by "\n", "\r\n" or "\r",
// come in reads of random sizes and read in reads of random sizes, through
// a reader of 16 bytes (lines longer than it) or of 4 KiB: the client gets
// each byte of the stream but the usage chunks', unchanged and in order.
// Before, a "\r\n" split between reads at an event's end lost or leaked
// a "\n" (the two tests above).
func TestUsageDropperRoundTrip(t *testing.T) {
	events := []struct {
		lines []string
		usage bool
	}{
		{[]string{`data: {"choices":[{"delta":{"content":"a"}}]}`}, false},
		{[]string{`data: {"choices":[{"delta":{}}],"usage":null}`}, false},
		{[]string{": ping"}, false},
		{[]string{"event: chunk", "id: 7", `data: {"choices":[{}]}`}, false},
		{[]string{`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`}, true},
		{[]string{"event: usage", `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`}, true},
	}
	ends := []string{"\n", "\r\n", "\r"}
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 0))
		var in, want strings.Builder
		for range 1 + rng.IntN(8) {
			ev := events[rng.IntN(len(events))]
			var b strings.Builder
			end := ""
			for _, l := range ev.lines {
				end = ends[rng.IntN(len(ends))]
				b.WriteString(l + end)
			}
			blank := ends[rng.IntN(len(ends))]
			for end == "\r" && blank == "\n" { // "\r" then "\n" is one line end, not a blank line
				blank = ends[rng.IntN(len(ends))]
			}
			b.WriteString(blank)
			in.WriteString(b.String())
			if !ev.usage {
				want.WriteString(b.String())
			}
		}
		in.WriteString("data: [DONE]\n\n")
		want.WriteString("data: [DONE]\n\n")
		var parts []string
		for s := in.String(); s != ""; {
			n := min(1+rng.IntN(12), len(s))
			parts, s = append(parts, s[:n]), s[n:]
		}
		src := &chunked{parts: slices.Clone(parts)} // parts kept whole for the message
		d := &usageDropper{rc: src, r: bufio.NewReaderSize(src, []int{16, 4096}[rng.IntN(2)])}
		var got []byte
		for {
			p := make([]byte, 1+rng.IntN(9))
			n, err := d.Read(p)
			got = append(got, p[:n]...)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
		}
		require.Equal(t, want.String(), string(got), "seed %d, in %q, in reads %q", seed, in.String(), parts)
	}
}
