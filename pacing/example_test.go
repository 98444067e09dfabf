package pacing_test

import (
	"fmt"

	"github.com/inflight-go/inflight/pacing"
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
