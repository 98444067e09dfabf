package pacing

import (
	"bufio"
	"io"
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
