package pacing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A key's secret goes to the upstream, and to a host the upstream
// redirects to only if it is the same host: an http.Client following a
// redirect to another host sends the request through the Transport again,
// and BearerKeys put the secret back on it (net/http's Client does not
// send a caller's own Authorization there).
func TestCredentialNotSentToAnotherHost(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	seen := func(who string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[who] = r.Header.Get("Authorization")
			mu.Unlock()
		}
	}
	other := httptest.NewServer(seen("other host"))
	t.Cleanup(other.Close)
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1) // another host name, the same machine
	var up *httptest.Server
	up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/same":
			http.Redirect(w, r, up.URL+"/end", http.StatusTemporaryRedirect)
		case "/away":
			http.Redirect(w, r, otherURL+"/end", http.StatusTemporaryRedirect)
		default:
			seen("upstream")(w, r)
		}
	}))
	t.Cleanup(up.Close)
	g := tGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k1"}}})
	client := &http.Client{Transport: pacing.NewTransport(nil, g, pacing.WithCredential(pacing.BearerKeys(map[string]string{"k1": "sk-secret", "": "sk-none"})))}
	for _, path := range []string{"/same", "/away"} {
		req, err := http.NewRequestWithContext(pacing.WithModelName(context.Background(), "m"), http.MethodGet, up.URL+path, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	assert.Equal(t, "Bearer sk-secret", got["upstream"], "a redirect to the same host keeps it")
	assert.Empty(t, got["other host"], "a redirect to another host goes without it")
	assert.Zero(t, g.Status().InFlight)
}
