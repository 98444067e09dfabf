package slots_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

func TestRequestModel(t *testing.T) {
	for _, tc := range []struct {
		name, body, model string
		max               int64
		wantErr           error
	}{
		{"a model", `{"model":"glm-5","stream":true}`, "glm-5", 1 << 10, nil},
		{"no model", `{"messages":[]}`, "", 1 << 10, nil},
		{"too large", `{"model":"glm-5","pad":"` + strings.Repeat("x", 100) + `"}`, "", 64, slots.ErrBodyTooLarge},
		{"no bound (math.MaxInt64)", `{"model":"glm-5"}`, "glm-5", math.MaxInt64, nil},
		{"exactly at the bound", `{"model":"glm-5"}`, "glm-5", int64(len(`{"model":"glm-5"}`)), nil},
		{"a negative bound is 0", `{"model":"glm-5"}`, "", -1, slots.ErrBodyTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(tc.body))
			model, err := slots.RequestModel(r, tc.max)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.model, model)
			rest, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Equal(t, tc.body, string(rest), "the body is left whole")
		})
	}
	t.Run("not JSON", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("model=glm-5"))
		_, err := slots.RequestModel(r, 1<<10)
		assert.Error(t, err)
	})
}

type modelKey struct{}

// TestRegistryBehindReverseProxy caps per model with a registry: the gateway
// reads the model from the incoming body, the Transport admits under
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
	}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		model, err := slots.RequestModel(r, 1<<20)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), modelKey{}, model)))
	}))
	t.Cleanup(gw.Close)

	client := newClient(t)
	body := `{"model":"glm-5","messages":[{"role":"user","content":"hi"}]}`
	for range 3 {
		resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	mu.Lock()
	assert.Equal(t, []string{body, body, body}, seen, "the upstream gets the body intact")
	mu.Unlock()
	waitFor(t, "all released", func() bool { return reg.Keys() == 0 })
	assert.Equal(t, uint64(3), reg.Stats().Acquired)
}
