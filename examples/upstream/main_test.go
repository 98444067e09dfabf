package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lineWriter hands each line written to it to a channel.
type lineWriter struct {
	mu    sync.Mutex
	buf   strings.Builder
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		s := w.buf.String()
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- s[:i]
		w.buf.Reset()
		w.buf.WriteString(s[i+1:])
	}
}

// await reads lines until one contains want, failing the test after 10 s.
func (w *lineWriter) await(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line := <-w.lines:
			if strings.Contains(line, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no line with %q", want)
		}
	}
}

func TestUpstream(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 16)}
	code := make(chan int, 1)
	go func() { code <- run(ctx, []string{"-listen", "127.0.0.1:0", "-limit", "1", "-every", "10ms"}, out) }()
	addr := regexp.MustCompile(`addr=(\S+)`).FindStringSubmatch(<-out.lines)[1]
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	first, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"glm-5","turn_ms":60000}`))
	require.NoError(t, err)
	line, err := bufio.NewReader(first.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n", line)

	second, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"glm-5","turn_ms":10}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(second.Body)
	second.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, second.StatusCode, "past the limit of 1")
	assert.Contains(t, string(body), `"code":"1302"`)
	// The live line: the stream still open, the refusal counted.
	out.await(t, "upstream: open 1 of 1 now; since the start 0 served, 1 refused (429), at most 2 open at once")
	first.Body.Close()

	stop()
	out.await(t, `msg="upstream: stopped"`)
	assert.Equal(t, 0, <-code)
	var usage strings.Builder
	assert.Equal(t, 0, run(context.Background(), []string{"-h"}, &usage))
	assert.Contains(t, usage.String(), "-limit")
	assert.Equal(t, 2, run(context.Background(), []string{"-every", "-1s"}, &usage))
}
