package pacing

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inflight-go/inflight/internal/httpx"
	"github.com/inflight-go/inflight/pacing/upstream"
)

// Kind is what an upstream's answer says about its limits (see
// upstream.Kind for each).
type Kind = upstream.Kind

// The kinds of answer (see upstream.Kind for what a Gate does with each).
const (
	Other       = upstream.Other       // says nothing about limits (a 400, a 500)
	Admitted    = upstream.Admitted    // the upstream took the request
	Concurrency = upstream.Concurrency // too many open at once: cuts a learned cap
	Rate        = upstream.Rate        // too many per unit of time: pauses starts
	Overload    = upstream.Overload    // the provider is busy: pauses starts, eases the cap
	Quota       = upstream.Quota       // the allowance is used up: the key leaves the pool
)

// Verdict is a classified answer: its Kind and how long the upstream asked
// to wait (0: it did not say).
type Verdict = upstream.Verdict

// A Classifier classifies an answer from its status, headers and the first
// bytes of its body (at most MaxClassifyBody; nil for a 2xx or 3xx).
// DefaultClassifier knows the OpenAI, Anthropic and Z.ai shapes; a
// Classifier for another provider may fall back to it.
type Classifier func(status int, h http.Header, body []byte) Verdict

// MaxClassifyBody is how much of an error body Classify reads.
const MaxClassifyBody = 4 << 10

// Classify classifies resp with c (nil: DefaultClassifier). For a status of
// 400 or more it reads at most MaxClassifyBody bytes of the body and puts
// them back: the caller, and its client, still read the whole body, and
// closing resp.Body still closes the upstream's. A 2xx or 3xx body is not
// touched.
func Classify(resp *http.Response, c Classifier) Verdict {
	if resp == nil {
		return Verdict{Kind: Other}
	}
	if c == nil {
		c = DefaultClassifier
	}
	if resp.StatusCode < 400 {
		return c(resp.StatusCode, resp.Header, nil)
	}
	var prefix []byte
	if resp.Body != nil && resp.Body != http.NoBody {
		buf := make([]byte, MaxClassifyBody)
		n, err := io.ReadFull(resp.Body, buf)
		prefix = buf[:n]
		rest := resp.Body // the rest, after the prefix
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			// A body need not give its error twice: the reader that
			// gets the prefix gets the error after it, not an end.
			rest = io.NopCloser(errReader{err})
		}
		resp.Body = &prefixed{Reader: io.MultiReader(bytes.NewReader(prefix), rest), body: resp.Body}
	}
	return c(resp.StatusCode, resp.Header, prefix)
}

// ClassifyAsRead is Classify for an answer that must not be held up: a
// proxy's, whose error body may come slowly (a stream that says what went
// wrong and stays open). It never reads the body itself. For a status of
// 400 or more it wraps resp.Body, which passes every byte on as it comes,
// and report gets the verdict from the first MaxClassifyBody bytes once, at
// the first of: that many bytes read, the body's end or a read error, its
// Close (a body cut short that would be a Concurrency refusal is Other: its
// lost bytes might have said quota or rate). An answer under 400, without a
// body, or nil (classified as Other) is reported at once. c gets resp's
// headers as they are when ClassifyAsRead is called: a change made to them
// after does not change the verdict. report may be called on the goroutine
// that reads or closes the body, before the Read or Close returns; a Close
// that comes while another goroutine's Read is reporting returns once
// report has, or after 5 s (report should not close the body itself:
// that Close waits so long).
func ClassifyAsRead(resp *http.Response, c Classifier, report func(Verdict)) {
	if c == nil {
		c = DefaultClassifier
	}
	switch {
	case resp == nil:
		report(Verdict{Kind: Other})
		return
	case resp.StatusCode < 400:
		report(c(resp.StatusCode, resp.Header, nil))
		return
	case httpx.Bodiless(httpx.Method(resp), resp):
		report(c(resp.StatusCode, resp.Header, nil))
		return
	}
	// The verdict is taken later, from the headers as they came: the
	// caller may set its own before the body is read (a Transport's
	// WithRateLimitHeaders, a ReverseProxy's ModifyResponse).
	resp.Body = &classifying{body: resp.Body, status: resp.StatusCode, header: resp.Header.Clone(), c: c, report: report}
}

// classifying is a body whose first bytes are kept, as they pass, for its
// answer's verdict.
type classifying struct {
	body   io.ReadCloser
	status int
	header http.Header
	c      Classifier
	report func(Verdict)

	mu     sync.Mutex // guards prefix, ended, done and reported; never held across the body's calls
	prefix []byte
	ended  bool // the body's end was read
	done   bool
	// reported is closed once report has returned (or panicked): a
	// decide that comes while another is reporting waits for it, so that
	// a Close concurrent with the Read that took the verdict does not
	// return (and free the slot) before the verdict is reported.
	reported chan struct{}
}

func (b *classifying) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.mu.Lock()
	if !b.done {
		b.prefix = append(b.prefix, p[:min(n, MaxClassifyBody-len(b.prefix))]...)
	}
	full := len(b.prefix) == MaxClassifyBody
	b.ended = b.ended || err == io.EOF
	b.mu.Unlock()
	if full || err != nil {
		b.decide()
	}
	return n, err
}

func (b *classifying) Close() error {
	decided := false
	defer func() {
		if !decided {
			b.body.Close() // the report panicked: the body goes all the same
		}
	}()
	b.decide() // before the body goes: a Slot may be released after it
	decided = true
	return b.body.Close()
}

// decide reports the verdict from the bytes seen so far, the first time.
// A body cut short (closed, or failed, before its end and before
// MaxClassifyBody bytes, with no whole JSON value read) may have lost what
// would have told a quota or a rate from a concurrency refusal: a
// Concurrency verdict from it, which is what a body that says nothing
// gets, is Other instead.
func (b *classifying) decide() {
	b.mu.Lock()
	if b.done {
		reported := b.reported
		b.mu.Unlock()
		awaitReport(reported) // taken by another call: reported once it returns
		return
	}
	b.done = true
	b.reported = make(chan struct{})
	defer close(b.reported) // also if the Classifier or report panics
	prefix := b.prefix
	cut := !b.ended && len(prefix) < MaxClassifyBody && !json.Valid(prefix)
	b.mu.Unlock()
	v := b.c(b.status, b.header, prefix)
	if cut && v.Kind == Concurrency {
		v.Kind = Other
	}
	b.report(v)
}

// reportWait bounds how long a body's Close waits for the report that a
// Read on another goroutine is making (ClassifyAsRead, WatchUsage), so
// that a slot freed on Close goes after it: a report that takes longer
// (a store's call, a Trace's hook), or one that closes the body itself,
// lets Close return then.
const reportWait = 5 * time.Second

// awaitReport waits until reported is closed, at most reportWait.
func awaitReport(reported <-chan struct{}) {
	select {
	case <-reported:
		return
	default:
	}
	t := time.NewTimer(reportWait)
	defer t.Stop()
	select {
	case <-reported:
	case <-t.C:
	}
}

// prefixed is a body whose first bytes were read and put back.
type prefixed struct {
	io.Reader
	body io.ReadCloser
}

func (p *prefixed) Close() error { return p.body.Close() }

// errReader gives err to every read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// errorBody is the part of the providers' error bodies a Classifier reads:
// OpenAI {"error":{"type","code","message"}}, Anthropic
// {"type":"error","error":{"type","message"}}, Z.ai {"error":{"code","message"}}
// (its code is a string of digits, sometimes a number).
type errorBody struct {
	Error struct {
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
	} `json:"error"`
}

// DefaultClassifier classifies the answers of OpenAI, Anthropic, Z.ai and
// servers that copy their shapes:
//
//   - 429 with OpenAI's insufficient_quota, or Z.ai's 1113 (arrears), 1304
//     (daily limit) or 1308 (usage limit of a period): Quota.
//   - 429 with Z.ai's 1303 (request frequency): Rate; its 1305: Overload.
//   - 429 whose rate-limit headers (x-ratelimit-remaining-*,
//     anthropic-ratelimit-*-remaining) show an allowance at 0: Rate.
//     OpenAI's rate_limit_exceeded and Anthropic's rate_limit_error are Rate
//     too, since neither provider caps concurrency on its public plans.
//   - Any other 429, Z.ai's 1302 among them: Concurrency. Z.ai answers an
//     account over its concurrency with 1302 whatever the message says
//     ("Rate limit reached for requests" as well), so without a header
//     saying a rate ran out, a 429 is taken as the concurrency it most often
//     is on the plans that learn a cap.
//   - 529, 503, and Anthropic's overloaded_error: Overload.
//   - under 400: Admitted; anything else: Other.
//
// RetryAfter is read from Retry-After (seconds or an HTTP date) or
// retry-after-ms; without either, from the reset header of each allowance
// at 0 (x-ratelimit-reset-*, anthropic-ratelimit-*-reset), the latest of
// them. Their numbers are decimal (Inf, NaN and hex floats are not read),
// and a wait is at most 24 hours.
func DefaultClassifier(status int, h http.Header, body []byte) Verdict {
	v := Verdict{RetryAfter: retryAfter(h)}
	if status < 400 {
		v.Kind = Admitted
		return v
	}
	var eb errorBody
	_ = json.Unmarshal(body, &eb) // a body that is not JSON, or cut short, says nothing
	code := strings.Trim(string(eb.Error.Code), `"`)
	spent, reset := spentAllowances(h)
	if v.RetryAfter == 0 {
		v.RetryAfter = reset
	}
	switch {
	case status == 529 || status == http.StatusServiceUnavailable || eb.Error.Type == "overloaded_error":
		v.Kind = Overload
	case status != http.StatusTooManyRequests:
		v.Kind = Other
	case code == "insufficient_quota" || eb.Error.Type == "insufficient_quota" ||
		code == "1113" || code == "1304" || code == "1308":
		v.Kind = Quota
	case code == "1303":
		v.Kind = Rate
	case code == "1305":
		v.Kind = Overload
	case spent:
		v.Kind = Rate
	case code == "rate_limit_exceeded" || eb.Error.Type == "rate_limit_error" || eb.Error.Type == "requests" || eb.Error.Type == "tokens":
		v.Kind = Rate
	default:
		v.Kind = Concurrency
	}
	return v
}

// spentAllowances reports whether a rate-limit header shows an allowance
// at 0 (x-ratelimit-remaining-*, anthropic-ratelimit-*-remaining) and how
// long until the latest of the spent ones resets, by the matching reset
// header (x-ratelimit-reset-*, a duration such as "6m0s";
// anthropic-ratelimit-*-reset, an RFC 3339 time); 0 when none says.
func spentAllowances(h http.Header) (spent bool, reset time.Duration) {
	for name, vals := range h {
		if len(vals) == 0 || strings.TrimSpace(vals[0]) != "0" {
			continue
		}
		n := strings.ToLower(name)
		var resetName string
		switch {
		case strings.HasPrefix(n, "x-ratelimit-remaining"):
			resetName = "x-ratelimit-reset" + strings.TrimPrefix(n, "x-ratelimit-remaining")
		case strings.HasPrefix(n, "anthropic-ratelimit-") && strings.HasSuffix(n, "-remaining"):
			resetName = strings.TrimSuffix(n, "-remaining") + "-reset"
		default:
			continue
		}
		spent = true
		reset = max(reset, resetIn(headerValue(h, resetName)))
	}
	return spent, reset
}

// resetIn reads a reset header: a duration ("1.5s", "6m0s"), a number of
// seconds, a Unix time in seconds or milliseconds (a number past 1e9 or
// 1e12: no allowance resets decades from now), or a time (RFC 3339); 0
// when it cannot be read or is past.
func resetIn(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if f, ok := durationSeconds(v); ok {
		return secondsUpToMax(f)
	}
	if f, ok := number(v); ok {
		now := float64(time.Now().UnixMilli()) / 1000
		switch {
		case f >= unixMillisFrom:
			return secondsUpToMax(f/1000 - now)
		case f >= unixSecondsFrom:
			return secondsUpToMax(f - now)
		}
		return secondsUpToMax(f)
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return secondsUpToMax(time.Until(t).Seconds())
	}
	return 0
}

// number parses v as a decimal number (a sign, a fraction and an exponent
// allowed), +Inf for one too large (strconv.ErrRange). What else
// strconv.ParseFloat reads (Inf, NaN, hex floats, underscores) is not a
// number here: no header means a wait by it.
func number(v string) (float64, bool) {
	if v == "" || strings.TrimLeft(v, "0123456789.eE+-") != "" {
		return 0, false // also without the error's allocation
	}
	f, err := strconv.ParseFloat(v, 64)
	return f, err == nil || errors.Is(err, strconv.ErrRange)
}

// durationSeconds reads v as a Go duration ("1.5s", "6m0s") in seconds,
// however long: time.ParseDuration fails past about 290 years, which a
// reset header asking for the most must not read as none.
func durationSeconds(v string) (float64, bool) {
	if d, err := time.ParseDuration(v); err == nil {
		return d.Seconds(), true
	}
	sum, any := 0.0, false
	for v != "" {
		i := strings.IndexFunc(v, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		j := strings.IndexAny(v[max(i, 0):], "0123456789.")
		if i <= 0 || j == 0 {
			return 0, false
		}
		if j < 0 {
			j = len(v) - i
		}
		f, ok := number(v[:i])
		unit, known := durationUnits[v[i:i+j]]
		if !ok || !known {
			return 0, false
		}
		sum, any, v = sum+f*unit, true, v[i+j:]
	}
	return sum, any
}

// durationUnits are time.ParseDuration's units, in seconds.
var durationUnits = map[string]float64{"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}

// A bare number in a reset header past these is a Unix time.
const (
	unixSecondsFrom = 1e9  // 2001, in seconds
	unixMillisFrom  = 1e12 // 2001, in milliseconds
)

// maxRetryAfter bounds what an upstream may ask for: more is a mistake or
// a quota reset, which QuotaPause handles.
const maxRetryAfter = 24 * time.Hour

// secondsUpToMax converts f seconds to a duration in [0, maxRetryAfter],
// compared before the conversion so that a huge value cannot overflow; NaN
// is 0.
func secondsUpToMax(f float64) time.Duration {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= maxRetryAfter.Seconds():
		return maxRetryAfter
	}
	return time.Duration(f * float64(time.Second))
}

// retryAfter reads Retry-After-Ms, if it asks for a wait, else Retry-After
// (seconds or an HTTP date); a number too large for a float asks for the
// most.
func retryAfter(h http.Header) time.Duration {
	if f, ok := number(headerValue(h, "Retry-After-Ms")); ok {
		if d := secondsUpToMax(f / 1000); d > 0 {
			return d
		}
	}
	ra := headerValue(h, "Retry-After")
	if ra == "" {
		return 0
	}
	if f, ok := number(ra); ok {
		return secondsUpToMax(f)
	}
	if t, err := http.ParseTime(ra); err == nil {
		if d := time.Until(t); d > 0 {
			return min(d, maxRetryAfter)
		}
	}
	return 0
}

// headerValue is h's first value of name in any spelling of it: a header
// map built by hand (a base RoundTripper's literal) may spell it otherwise
// than Get looks it up, and the allowances at 0 beside it are read so.
func headerValue(h http.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, name) {
			return v[0]
		}
	}
	return ""
}
