package slots_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"

	"github.com/inflight-go/inflight/slots"
)

func ExampleProxyErrorHandler() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "answer")
	}))
	defer upstream.Close()
	target, _ := url.Parse(upstream.URL)

	lim := slots.NewLimiter(0) // full: every request is turned away
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:    slots.NewTransport(nil, func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() }),
		ErrorHandler: slots.ProxyErrorHandler(), // without it: an empty 502
	})
	defer proxy.Close()

	resp, err := proxy.Client().Get(proxy.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, resp.Header.Get("Retry-After"))
	fmt.Print(string(body))
	// Output:
	// 429 1
	// {"error":{"type":"rate_limit_error","message":"too many requests in flight: 0 of 0, 0 queued (limit reached)"}}
}

func ExampleWithErrorWriter() {
	// The error shape of an API's clients, here {"error": {"message": ...}}.
	writeJSON := func(w http.ResponseWriter, status int, message string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		var body struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		body.Error.Message = message
		_ = json.NewEncoder(w).Encode(body)
	}
	lim := slots.NewLimiter(0)
	handler := slots.Middleware(func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() },
		slots.WithErrorWriter(writeJSON))(http.NotFoundHandler())

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
	fmt.Println(rec.Code, rec.Header().Get("Retry-After"))
	fmt.Print(rec.Body.String())
	// Output:
	// 429 1
	// {"error":{"message":"too many requests in flight: 0 of 0, 0 queued (limit reached)"}}
}
