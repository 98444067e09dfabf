package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

func orgLeft(t *testing.T, g *Gateway, org string) int {
	t.Helper()
	st := g.orgBudgets.Status(org)
	if st == nil { // none kept: never reserved, or dropped once idle
		return g.orgLimits(org).TokensPerMinute
	}
	require.Len(t, st, 1)
	return st[0].Left
}

func sendOrg(t *testing.T, url, org, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(OrgHeader, org)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

const orgCfg = `{"upstream": "%s", "orgs": {"default_limit": 10, "budgets": {"org-a": {"tokens_per_minute": 1000}}},
	"tokens": {"expected_output": 100}}`

// A request answered 400 for its X-Priority charges its org nothing.
func TestOrgBudgetBadPriority(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("never sent")
	}))
	t.Cleanup(up.Close)
	srv, g := startGatewayWith(t, up.URL, orgCfg)
	resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, map[string]string{"X-Priority": "bogus"})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, 1000, orgLeft(t, g, "org-a"), "a request never sent charges nothing")
}

// An answer refused as overloaded (503) gives back what it charged the
// org's budget, as the provider's.
func TestOrgBudgetRefusedUpstream(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"overloaded","type":"server_error"}}`)
	}))
	t.Cleanup(up.Close)
	srv, g := startGatewayWith(t, up.URL, `{"upstream": "%s",
		"provider": {"tokens_per_minute": 1000},
		"orgs": {"default_limit": 10, "budgets": {"org-a": {"tokens_per_minute": 1000}}},
		"tokens": {"expected_output": 100}}`)
	resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	for _, b := range g.gate.Budgets() {
		assert.Equal(t, b.Limit, b.Left, "the provider's budget got it back")
	}
	assert.Equal(t, 1000, orgLeft(t, g, "org-a"), "settled as the provider's budgets are (README)")
}

// A request that goes ahead without a slot (on_wait_timeout "proceed") is
// settled with its usage in its org's budget.
func TestOrgBudgetBypassSettled(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	first := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get(OrgHeader), "hold") {
			once.Do(func() { close(first) })
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	}))
	t.Cleanup(up.Close)
	srv, g := startGatewayWith(t, up.URL, `{"upstream": "%s",
		"provider": {"max_concurrent_requests": 1, "max_queue_wait_ms": 50, "on_wait_timeout": "proceed"},
		"orgs": {"default_limit": 10, "budget": {"tokens_per_minute": 1000}},
		"tokens": {"expected_output": 100}}`)
	go sendOrg(t, srv.URL, "hold", `{"model":"m","messages":[{"content":"x"}]}`, nil)
	<-first
	resp, _ := sendOrg(t, srv.URL, "org-b", `{"model":"m","messages":[{"content":"hello"}]}`, nil)
	close(release)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1000-6, orgLeft(t, g, "org-b"), "settled with the 5 + 1 reported")
}

// Each request ends its reservation of its org's budget, settled or not
// (an answer without usage: the estimate stands), so the org's Budget is
// dropped once idle. (pacing.Budgets keeps a Budget while a reservation is
// open, past a minute too, so a long stream settles into it.)
func TestOrgBudgetEndsEachReservation(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("X-Usage") == "" {
			io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
			return
		}
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	}))
	t.Cleanup(up.Close)
	srv, g := startGatewayWith(t, up.URL, `{"upstream": "%s",
		"orgs": {"default_limit": 10, "budget": {"tokens_per_minute": 1000}}, "tokens": {"expected_output": 100}}`)
	mock := clock.NewMock()
	g.orgBudgets = pacing.NewBudgets(g.orgLimits, slots.WithClock(mock))
	for _, hdr := range []map[string]string{nil, {"X-Usage": "1"}} {
		resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, hdr)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.NotNil(t, g.orgBudgets.Status("org-a"))
	mock.Add(61 * time.Second)
	for i := range 2048 { // enough new orgs to prune the idle ones
		r, err := g.orgBudgets.Reserve(fmt.Sprintf("org-%d", i), pacing.Tokens{Input: 1})
		require.NoError(t, err)
		r.Close()
	}
	assert.Nil(t, g.orgBudgets.Status("org-a"), "nothing left open: dropped once idle")
}
