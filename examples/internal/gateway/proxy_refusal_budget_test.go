package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A request that the proxy refuses before it reaches the provider's
// Transport (httputil.ReverseProxy answers an Upgrade it cannot relay,
// with a protocol name not all printable ASCII, with its ErrorHandler) is
// never sent: it charges its org's budget nothing. Its reservation was
// closed with its estimate standing.
func TestOrgBudgetProxyRefusalChargesNothing(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("never sent")
	}))
	t.Cleanup(up.Close)
	srv, g := startGatewayWith(t, up.URL, orgCfg)
	resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`,
		map[string]string{"Connection": "Upgrade", "Upgrade": "w\u00e9bsocket"})
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "the proxy's refusal")
	assert.Equal(t, 1000, orgLeft(t, g, "org-a"), "a request never sent charges nothing")
}
