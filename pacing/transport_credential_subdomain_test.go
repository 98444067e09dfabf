package pacing_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A redirect to a subdomain of the upstream's host is another host too:
// net/http's Client sends the caller's own Authorization there (it trusts
// subdomains), so the Transport, which puts no key's secret on it, takes
// the caller's off as well: a client's own credential never reaches the
// upstream (BearerKeys).
func TestCredentialRedirectToASubdomain(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/away" {
			http.Redirect(w, r, "http://eu.api.test/end", http.StatusTemporaryRedirect)
			return
		}
		mu.Lock()
		got[r.Host] = r.Header.Get("Authorization")
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	base := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String()) // every host name is this server
	}}
	t.Cleanup(base.CloseIdleConnections)
	g := tGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k1"}}})
	client := &http.Client{Transport: pacing.NewTransport(base, g, pacing.WithCredential(pacing.BearerKeys(map[string]string{"k1": "sk-secret"})))}
	req, err := http.NewRequestWithContext(pacing.WithModelName(context.Background(), "m"), http.MethodGet, "http://api.test/away", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer the-clients")
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, got, "eu.api.test", "the redirect was followed")
	assert.Empty(t, got["eu.api.test"], "neither the key's secret nor the client's own")
	assert.Zero(t, g.Status().InFlight)
}
