package gateway

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Events read a byte at a time, CRLF line ends and comments pass whole;
// only the usage chunk is taken out.
func TestUsageDropperSplitReads(t *testing.T) {
	in := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\r\n\r\n" +
		": keepalive\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	want := strings.Replace(in, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n", "", 1)
	src := io.NopCloser(iotest.OneByteReader(strings.NewReader(in)))
	d := &usageDropper{rc: src, r: bufio.NewReader(src)}
	got, err := io.ReadAll(iotest.OneByteReader(d))
	require.NoError(t, err)
	assert.Equal(t, want, string(got))
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

// A short stream that comes with its Content-Length (an upstream that
// ended before it flushed) reaches the client whole without its usage
// chunk: the length, which no longer holds, is not passed on.
func TestUsageDropperContentLength(t *testing.T) {
	body := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n" +
		"data: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	t.Cleanup(up.Close)
	srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s", "orgs": {"default_limit": 10}, "provider": {"tokens_per_minute": 100000}}`)
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "the whole stream, no unexpected EOF")
	assert.Equal(t, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", string(got))
}
