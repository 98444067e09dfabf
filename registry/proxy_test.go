package registry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

type modelKey struct{}

// TestRegistryBehindReverseProxy caps per model with a registry: the
// handler puts the model in the context, the Transport admits under
// "provider" and "provider/<model>", and the upstream gets the body intact.
func TestRegistryBehindReverseProxy(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, string(b))
		mu.Unlock()
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)

	reg := registry.New[string](slots.Unlimited)
	reg.SetLimit("provider", 4)
	reg.SetLimit("provider/glm-5", 1)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) {
			model, _ := r.Context().Value(modelKey{}).(string)
			return reg.AcquireAll(r.Context(), "provider", "provider/"+model)
		}),
		ErrorHandler: slots.ProxyErrorHandler(),
	}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), modelKey{}, r.Header.Get("X-Model"))
		proxy.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(gw.Close)

	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	body := `{"model":"glm-5","messages":[{"role":"user","content":"hi"}]}`
	for range 3 {
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Model", "glm-5")
		resp, err := client.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	mu.Lock()
	assert.Equal(t, []string{body, body, body}, seen, "the upstream gets the body intact")
	mu.Unlock()
	require.Eventually(t, func() bool { return reg.Keys() == 0 }, 10*time.Second, time.Millisecond, "all released")
	assert.Equal(t, uint64(3), reg.Stats().Acquired)
}
