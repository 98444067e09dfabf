package pacing_test

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

func TestDefaultClassifier(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		header http.Header
		body   string
		want   pacing.Verdict
	}{
		{"a 200 is admitted", 200, nil, "", pacing.Verdict{Kind: pacing.Admitted}},
		{"Z.ai's 1302 is concurrency, whatever its message", 429, http.Header{"Retry-After": {"1"}},
			`{"error":{"code":"1302","message":"Rate limit reached for requests"}}`, pacing.Verdict{Kind: pacing.Concurrency, RetryAfter: time.Second}},
		{"Z.ai's 1302 with a rate header at 0 is rate", 429, http.Header{"X-Ratelimit-Remaining-Requests": {"0"}},
			`{"error":{"code":"1302","message":"Rate limit reached for requests"}}`, pacing.Verdict{Kind: pacing.Rate}},
		{"Z.ai's 1303 is rate", 429, nil, `{"error":{"code":"1303","message":"High frequency"}}`, pacing.Verdict{Kind: pacing.Rate}},
		{"Z.ai's 1308 is quota", 429, nil, `{"error":{"code":1308,"message":"Usage limit reached"}}`, pacing.Verdict{Kind: pacing.Quota}},
		{"OpenAI's insufficient_quota is quota", 429, nil,
			`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, pacing.Verdict{Kind: pacing.Quota}},
		{"OpenAI's rate_limit_exceeded is rate", 429, http.Header{"Retry-After-Ms": {"1500"}},
			`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, pacing.Verdict{Kind: pacing.Rate, RetryAfter: 1500 * time.Millisecond}},
		{"Anthropic's rate_limit_error is rate", 429, http.Header{"Anthropic-Ratelimit-Requests-Remaining": {"0"}},
			`{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit"}}`, pacing.Verdict{Kind: pacing.Rate}},
		{"Anthropic's 529 is overload", 529, nil, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, pacing.Verdict{Kind: pacing.Overload}},
		{"a 503 is overload", 503, http.Header{"Retry-After": {"3"}}, "busy", pacing.Verdict{Kind: pacing.Overload, RetryAfter: 3 * time.Second}},
		{"a 429 without a body is concurrency", 429, nil, "", pacing.Verdict{Kind: pacing.Concurrency}},
		{"a 400 says nothing about limits", 400, nil, `{"error":{"code":"1302"}}`, pacing.Verdict{Kind: pacing.Other}},
		{"a 500 says nothing about limits", 500, nil, "", pacing.Verdict{Kind: pacing.Other}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, pacing.DefaultClassifier(tc.status, tc.header, []byte(tc.body)))
		})
	}
}

type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error { c.closed++; return nil }

func TestClassifyLeavesTheBodyIntact(t *testing.T) {
	t.Run("an error body reads in full after classification, and closes the original", func(t *testing.T) {
		body := `{"error":{"code":"1302","message":"Rate limit reached for requests"}}` + strings.Repeat(" ", 3*pacing.MaxClassifyBody)
		orig := &closeCounter{Reader: strings.NewReader(body)}
		resp := &http.Response{StatusCode: 429, Header: http.Header{}, Body: orig}
		assert.Equal(t, pacing.Concurrency, pacing.Classify(resp, nil).Kind)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, body, string(got))
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, 1, orig.closed)
	})
	t.Run("reads at most MaxClassifyBody of an error body", func(t *testing.T) {
		var seen int
		c := func(status int, h http.Header, b []byte) pacing.Verdict { seen = len(b); return pacing.Verdict{} }
		resp := &http.Response{StatusCode: 500, Body: io.NopCloser(strings.NewReader(strings.Repeat("x", 10*pacing.MaxClassifyBody)))}
		pacing.Classify(resp, c)
		assert.Equal(t, pacing.MaxClassifyBody, seen)
	})
	t.Run("a success's body is not touched", func(t *testing.T) {
		orig := &closeCounter{Reader: strings.NewReader("data: ...")}
		resp := &http.Response{StatusCode: 200, Body: orig}
		assert.Equal(t, pacing.Admitted, pacing.Classify(resp, nil).Kind)
		assert.Same(t, orig, resp.Body)
	})
	t.Run("a nil body is left nil", func(t *testing.T) {
		resp := &http.Response{StatusCode: 429}
		assert.Equal(t, pacing.Concurrency, pacing.Classify(resp, nil).Kind)
		assert.Nil(t, resp.Body)
	})
}

// TestResetHeadersGiveTheWait: without a Retry-After, a rate refusal waits
// for the reset of the allowance that ran out (OpenAI's x-ratelimit-reset-*
// durations, Anthropic's anthropic-ratelimit-*-reset times); an allowance
// with room left, a reset that cannot be read, or a reset in the past says
// nothing, and a Retry-After, when given, wins.
func TestResetHeadersGiveTheWait(t *testing.T) {
	rate := `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`
	future := time.Now().Add(30 * time.Second).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name     string
		header   http.Header
		min, max time.Duration
	}{
		{"OpenAI's requests allowance", http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"1.5s"},
			"X-Ratelimit-Remaining-Tokens": {"900"}, "X-Ratelimit-Reset-Tokens": {"6m0s"}}, 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"OpenAI's tokens allowance", http.Header{"X-Ratelimit-Remaining-Requests": {"10"}, "X-Ratelimit-Reset-Requests": {"1s"},
			"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"2m59.5s"}}, 179500 * time.Millisecond, 179500 * time.Millisecond},
		{"both spent: the later reset", http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"20ms"},
			"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"3s"}}, 3 * time.Second, 3 * time.Second},
		{"Anthropic's requests allowance", http.Header{"Anthropic-Ratelimit-Requests-Remaining": {"0"}, "Anthropic-Ratelimit-Requests-Reset": {future}},
			28 * time.Second, 30 * time.Second},
		{"a reset in the past", http.Header{"Anthropic-Ratelimit-Requests-Remaining": {"0"}, "Anthropic-Ratelimit-Requests-Reset": {past}}, 0, 0},
		{"an unreadable reset", http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"soon"}}, 0, 0},
		{"an allowance with room says nothing", http.Header{"X-Ratelimit-Remaining-Requests": {"3"}, "X-Ratelimit-Reset-Requests": {"5s"}}, 0, 0},
		{"Retry-After wins", http.Header{"Retry-After": {"2"}, "X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"9s"}},
			2 * time.Second, 2 * time.Second},
		{"a reset over a day is a day", http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"100000h"}},
			24 * time.Hour, 24 * time.Hour},
		{"a bare number of seconds", http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"7"}},
			7 * time.Second, 7 * time.Second},
		{"a Unix time in seconds", http.Header{"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests": {strconv.FormatInt(time.Now().Add(20*time.Second).Unix(), 10)}}, 18 * time.Second, 21 * time.Second},
		{"a Unix time in milliseconds", http.Header{"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests": {strconv.FormatInt(time.Now().Add(20*time.Second).UnixMilli(), 10)}}, 19 * time.Second, 21 * time.Second},
		{"a Unix time past", http.Header{"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests": {strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := pacing.DefaultClassifier(429, tc.header, []byte(rate))
			assert.Equal(t, pacing.Rate, v.Kind)
			assert.GreaterOrEqual(t, v.RetryAfter, tc.min)
			assert.LessOrEqual(t, v.RetryAfter, tc.max)
		})
	}
}

// stalling is an error body that gives its first bytes and then nothing
// until released, as an upstream that sends an error and holds the stream.
type stalling struct {
	first   string
	release chan struct{}
	closed  chan struct{}
}

func (s *stalling) Read(p []byte) (int, error) {
	if s.first != "" {
		n := copy(p, s.first)
		s.first = s.first[n:]
		return n, nil
	}
	select {
	case <-s.release:
		return 0, io.EOF
	case <-s.closed:
		return 0, errors.New("read on closed body")
	}
}

func (s *stalling) Close() error { close(s.closed); return nil }

func TestClassifyAsRead(t *testing.T) {
	const zai = `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`
	record := func() (func(pacing.Verdict), func() []pacing.Verdict) {
		var mu sync.Mutex
		var got []pacing.Verdict
		return func(v pacing.Verdict) { mu.Lock(); got = append(got, v); mu.Unlock() },
			func() []pacing.Verdict { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
	}

	t.Run("a slow error body is passed on as it comes, and classified by its Close", func(t *testing.T) {
		report, got := record()
		body := &stalling{first: zai, release: make(chan struct{}), closed: make(chan struct{})}
		resp := &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"2"}}, Body: body}
		pacing.ClassifyAsRead(resp, nil, report)
		assert.Empty(t, got(), "nothing is read before the caller reads")
		buf := make([]byte, 512)
		n, err := resp.Body.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, zai, string(buf[:n]), "the first bytes pass at once")
		assert.Empty(t, got(), "the body has not ended")
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, []pacing.Verdict{{Kind: pacing.Concurrency, RetryAfter: 2 * time.Second}}, got(), "decided at Close, from what passed")
	})
	t.Run("at its end", func(t *testing.T) {
		report, got := record()
		resp := &http.Response{StatusCode: 429, Body: io.NopCloser(strings.NewReader(`{"error":{"code":"1303"}}`))}
		pacing.ClassifyAsRead(resp, nil, report)
		all, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, `{"error":{"code":"1303"}}`, string(all))
		assert.Equal(t, []pacing.Verdict{{Kind: pacing.Rate}}, got())
		resp.Body.Close()
		assert.Len(t, got(), 1, "once")
	})
	t.Run("once MaxClassifyBody bytes have passed, before the rest", func(t *testing.T) {
		report, got := record()
		long := zai + strings.Repeat(" ", pacing.MaxClassifyBody)
		body := &stalling{first: long, release: make(chan struct{}), closed: make(chan struct{})}
		resp := &http.Response{StatusCode: 429, Body: body}
		pacing.ClassifyAsRead(resp, nil, report)
		_, err := io.ReadFull(resp.Body, make([]byte, len(long)))
		require.NoError(t, err)
		assert.Equal(t, []pacing.Verdict{{Kind: pacing.Concurrency}}, got(), "decided from the first 4 KiB, the body still open")
		resp.Body.Close()
		assert.Len(t, got(), 1)
	})
	t.Run("a body closed before what it would have said is no evidence", func(t *testing.T) {
		for _, body := range []string{`{"error":{"code":"1113","message":"arrears"}}`, zai} {
			report, got := record()
			resp := &http.Response{StatusCode: 429, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body))}
			pacing.ClassifyAsRead(resp, nil, report)
			resp.Body.Close() // unread: the client went away as it came
			assert.Equal(t, []pacing.Verdict{{Kind: pacing.Other}}, got(), "not a concurrency refusal")
		}
		report, got := record()
		resp := &http.Response{StatusCode: 529, Body: io.NopCloser(strings.NewReader("busy"))}
		pacing.ClassifyAsRead(resp, nil, report)
		resp.Body.Close()
		assert.Equal(t, []pacing.Verdict{{Kind: pacing.Overload}}, got(), "the status alone says overload")
	})
	t.Run("a success, a nil answer and an empty body at once", func(t *testing.T) {
		report, got := record()
		pacing.ClassifyAsRead(&http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("data"))}, nil, report)
		pacing.ClassifyAsRead(nil, nil, report)
		pacing.ClassifyAsRead(&http.Response{StatusCode: 529, Body: http.NoBody}, nil, report)
		assert.Equal(t, []pacing.Verdict{{Kind: pacing.Admitted}, {Kind: pacing.Other}, {Kind: pacing.Overload}}, got())
	})
	t.Run("a Close racing a Read reports once", func(t *testing.T) {
		report, got := record()
		body := &stalling{first: zai, release: make(chan struct{}), closed: make(chan struct{})}
		resp := &http.Response{StatusCode: 429, Body: body}
		pacing.ClassifyAsRead(resp, nil, report)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.ReadAll(resp.Body)
		}()
		resp.Body.Close()
		<-done
		assert.Len(t, got(), 1)
	})
}

// The verdict of an error body classified as it is read comes from its
// answer's headers as they were when ClassifyAsRead was called: headers
// set on the answer after (a Transport's or a proxy's own) are not the
// upstream's. Before, the body kept the answer's Header map itself, and a
// rate-limit header written into it before the body was read (an
// allowance at 0) made a concurrency refusal Rate.
func TestClassifyAsReadKeepsTheHeadersItWasGiven(t *testing.T) {
	var got []pacing.Verdict
	resp := &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"1"}},
		Body: io.NopCloser(strings.NewReader(`{"error":{"code":"1302"}}`))}
	pacing.ClassifyAsRead(resp, nil, func(v pacing.Verdict) { got = append(got, v) })
	resp.Header.Set("X-Ratelimit-Remaining-Requests", "0")
	resp.Header.Set("Retry-After", "60")
	_, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, []pacing.Verdict{{Kind: pacing.Concurrency, RetryAfter: time.Second}}, got)
}
