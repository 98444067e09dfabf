package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

func ExampleParse() {
	c, err := pacing.Parse([]byte(`{
		"max_concurrent_requests": 5,
		"requests_per_minute": 40,
		"min_interval_ms": 1500,
		"models": {"glm-5.3": {"max_concurrent_requests": 2}}
	}`))
	fmt.Println(err, c.Interval(), c.Models["glm-5.3"].MaxConcurrentRequests)

	_, err = pacing.Parse([]byte(`{"requests_per_minute": 0, "on_wait_timeout": "retry"}`))
	fmt.Println(err)
	// Output:
	// <nil> 1.5s 2
	// pacing: on_wait_timeout: "retry" is neither "reject" nor "proceed"
}

// A gateway reports each upstream answer to the Gate that admitted its
// request, before it hands the body on: the learned cap moves on
// concurrency 429s and on admissions, and Retry-After pauses new starts.
func ExampleGate_Report() {
	gate, _ := pacing.NewGate("zai", pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4}})
	var grants []pacing.Grant
	for range 5 { // the fifth start tests the cap: 4 is not proven
		gt, _ := gate.Acquire(context.Background(), "glm-5")
		grants = append(grants, gt)
	}
	// The upstream refuses the fifth: it allows at most 4 at once.
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}},
		Body: io.NopCloser(strings.NewReader(`{"error":{"code":"1302","message":"Rate limit reached for requests"}}`))}
	v := pacing.Classify(resp, nil)
	gate.Report(grants[4], v)
	resp.Body = slots.WrapBody(resp.Body, grants[4].Slot) // the client still reads the whole body
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	l := gate.Learned()
	gate.Close()
	fmt.Println(v.Kind, v.RetryAfter, len(body) > 0)
	fmt.Println("cap", l.Cap, "ceiling", l.Ceiling, "limit", l.Limit)
	// Output:
	// concurrency 1s true
	// cap 4 ceiling 4 limit 4
}
