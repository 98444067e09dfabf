package pacing_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
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
	gate, err := pacing.NewGate("zai", pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4}})
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close()
	var grants []pacing.Grant
	for range 5 { // the fifth start tests the cap: 4 is not proven
		gt, err := gate.Acquire(context.Background(), "glm-5")
		if err != nil {
			log.Fatal(err)
		}
		defer gt.Slot.Release() // the four others, when their answers end
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
	fmt.Println(v.Kind, v.RetryAfter, len(body) > 0)
	fmt.Println("cap", l.Cap, "ceiling", l.Ceiling, "limit", l.Limit)
	// Output:
	// concurrency 1s true
	// cap 4 ceiling 4 limit 4
}

// A reverse proxy in front of a model provider: the provider's cap, a
// model's cap learned from the provider's 429s, and a pool of two API
// keys, added as the proxy's Transport. Each request holds its slots until
// its streamed answer has been relayed to the end; the client's own API key
// is replaced by one of the pool's.
func ExampleNewTransport() {
	// The provider, simulated: it answers 429 to a fourth request at once.
	provider := &pacingtest.Upstream{Schedule: []pacingtest.Step{{Cap: 3}}, HeaderDelay: 5 * time.Millisecond}
	provider.Start()

	gate, err := pacing.NewGate("provider", pacing.Config{
		MaxConcurrentRequests: 4,
		Models:                map[string]pacing.ModelConfig{"glm-5": {Adaptive: &pacing.AdaptiveConfig{Initial: 2, Max: 3}}},
		APIKeys:               []pacing.KeyConfig{{ID: "a", MaxConcurrentRequests: 2}, {ID: "b", MaxConcurrentRequests: 2}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close()
	target, _ := url.Parse("https://api.provider.example")
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = pacing.NewTransport(provider, gate,
		pacing.WithCredential(pacing.BearerKeys(map[string]string{"a": "sk-a", "b": "sk-b"})))
	proxy.ErrorHandler = slots.ProxyErrorHandler() // a refusal: 429 with Retry-After
	srv := httptest.NewServer(proxy)
	defer srv.Close()

	// Ten clients at once, each streaming an answer of 50 ms.
	var wg sync.WaitGroup
	codes := make([]int, 10)
	for i := range codes {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
			req.Header.Set(pacingtest.ServiceHeader, "50ms")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				log.Print(err)
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	c := provider.Counts()
	fmt.Println("answers:", codes)
	fmt.Println("the provider refused:", c.Refused, "and never had more than 3 at once:", c.Peak <= 3)
	fmt.Println("held now:", gate.Status().InFlight)
	// Output:
	// answers: [200 200 200 200 200 200 200 200 200 200]
	// the provider refused: 0 and never had more than 3 at once: true
	// held now: 0
}
