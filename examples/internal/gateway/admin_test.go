package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

func newTestLogger(level slog.Level) (*slog.Logger, *testrig.Buffer) {
	b := new(testrig.Buffer)
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: level})), b
}

func do(t *testing.T, client *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestAdminNeedsTheToken(t *testing.T) {
	u := newUpstream(t)
	log, logs := newTestLogger(slog.LevelInfo)
	srv, gw := startGatewayWith(t, u.srv.URL, testConfig, WithLogger(log))
	client := srv.Client()
	for _, tc := range []struct{ name, header string }{
		{"no header", ""},
		{"a wrong token", "Bearer not-the-admin-token-at-all"},
		{"the token without Bearer", testAdminToken},
		{"a prefix of the token", "Bearer " + testAdminToken[:10]},
	} {
		t.Run("401 with "+tc.name, func(t *testing.T) {
			for _, req := range []*http.Request{
				httptest.NewRequest(http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", strings.NewReader(`{"limit":0}`)),
				httptest.NewRequest(http.MethodDelete, srv.URL+"/admin/orgs/org-a/concurrent-limit", nil),
				httptest.NewRequest(http.MethodGet, srv.URL+"/admin/orgs/org-a/concurrent-limit", nil),
				httptest.NewRequest(http.MethodGet, srv.URL+"/debug/slots", nil),
				httptest.NewRequest(http.MethodGet, srv.URL+"/debug/provider", nil),
			} {
				req.RequestURI = ""
				if tc.header != "" {
					req.Header.Set("Authorization", tc.header)
				}
				status, body := do(t, client, req)
				assert.Equal(t, http.StatusUnauthorized, status, req.URL.Path)
				assert.Contains(t, body, `"type":"authentication_error"`)
			}
		})
	}
	assert.Equal(t, 2, gw.orgLimit("org-a"), "no change went through")
	assert.NotContains(t, logs.String(), "org limit")

	t.Run("with the token: GET tells the limit and its source; PATCH logs org, old and new; DELETE goes back to the configured limit", func(t *testing.T) {
		limitOf := func(org string) string {
			status, body := do(t, client, adminRequest(t, http.MethodGet, srv.URL+"/admin/orgs/"+org+"/concurrent-limit", ""))
			require.Equal(t, http.StatusOK, status, body)
			return body
		}
		assert.JSONEq(t, `{"org":"org-a","limit":2,"source":"config","configured":2,"scope":"this gateway","persisted":false}`, limitOf("org-a"))
		assert.JSONEq(t, `{"org":"org-z","limit":3,"source":"default","configured":3,"scope":"this gateway","persisted":false}`, limitOf("org-z"))

		status, body := do(t, client, adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", `{"limit":7}`))
		require.Equal(t, http.StatusOK, status, body)
		assert.JSONEq(t, `{"org":"org-a","limit":7,"source":"override","configured":2,"scope":"this gateway","persisted":false}`, body)
		assert.Equal(t, 7, gw.orgLimit("org-a"))
		assert.JSONEq(t, body, limitOf("org-a"))
		assert.Contains(t, logs.String(), `msg="gateway: org limit set" org=org-a old=2 new=7 was_from=config`)

		status, body = do(t, client, adminRequest(t, http.MethodDelete, srv.URL+"/admin/orgs/org-a/concurrent-limit", ""))
		require.Equal(t, http.StatusOK, status, body)
		assert.JSONEq(t, `{"org":"org-a","limit":2,"source":"config","configured":2,"scope":"this gateway","persisted":false}`, body, "the configured limit, not the default")
		assert.Equal(t, 2, gw.orgLimit("org-a"))
		assert.Contains(t, logs.String(), `msg="gateway: org limit removed" org=org-a old=7 new=2 now_from=config`)

		status, _ = do(t, client, adminRequest(t, http.MethodDelete, srv.URL+"/admin/orgs/org-a/concurrent-limit", ""))
		assert.Equal(t, http.StatusNotFound, status, "nothing left to remove")
		status, _ = do(t, client, adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/"+strings.Repeat("o", 300)+"/concurrent-limit", `{"limit":1}`))
		assert.Equal(t, http.StatusBadRequest, status, "an absurd org name")
		status, body = do(t, client, adminRequest(t, http.MethodGet, srv.URL+"/debug/provider", ""))
		assert.Equal(t, http.StatusOK, status)
		assert.Contains(t, body, `"in_flight":0`)
		assert.Contains(t, body, `"last_start":null`)
	})
	t.Run("the scheme Bearer in any case", func(t *testing.T) {
		for _, scheme := range []string{"bearer", "BEARER", "beaRer"} {
			req := adminRequest(t, http.MethodGet, srv.URL+"/debug/provider", "")
			req.Header.Set("Authorization", scheme+" "+testAdminToken)
			status, _ := do(t, client, req)
			assert.Equal(t, http.StatusOK, status, scheme)
		}
		req := adminRequest(t, http.MethodGet, srv.URL+"/debug/provider", "")
		req.Header.Set("Authorization", "Basic "+testAdminToken)
		status, _ := do(t, client, req)
		assert.Equal(t, http.StatusUnauthorized, status, "another scheme")
	})
	t.Run("a PATCH body is one object with only the limit", func(t *testing.T) {
		for _, body := range []string{
			`{"limit":5} {"limit":0}`,
			`{"limit":5}x`,
			`{"limit":5,"limits":0}`,
			`{"limit":5,"org":"org-b"}`,
			`[{"limit":5}]`,
		} {
			status, answer := do(t, client, adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", body))
			assert.Equal(t, http.StatusBadRequest, status, body)
			assert.Contains(t, answer, `want one JSON object, {\"limit\": N} with N >= 0`, body)
		}
		assert.Equal(t, 2, gw.orgLimit("org-a"), "none went through: the configured limit still")
		status, _ := do(t, client, adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", "{\"limit\":5}\n"))
		assert.Equal(t, http.StatusOK, status, "a final newline is fine")
	})
}

func TestAdminWithoutAnAdminSectionIsNotServed(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, `{"upstream": "%s", "orgs": {"limits": {"org-a": 2}}}`)
	for _, req := range []*http.Request{
		adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", `{"limit":0}`),
		adminRequest(t, http.MethodDelete, srv.URL+"/admin/orgs/org-a/concurrent-limit", ""),
		adminRequest(t, http.MethodGet, srv.URL+"/debug/slots", ""),
	} {
		status, _ := do(t, srv.Client(), req)
		assert.Equal(t, http.StatusNotFound, status, req.URL.Path)
	}
	assert.Equal(t, 2, gw.orgLimit("org-a"))
	assert.Nil(t, gw.AdminHandler())
}

func TestAdminOnItsOwnListener(t *testing.T) {
	u := newUpstream(t)
	t.Setenv("GATEWAY_TEST_ADMIN_TOKEN", testAdminToken)
	srv, gw := startGatewayWith(t, u.srv.URL, `{"upstream": "%s", "admin": {"token_env": "GATEWAY_TEST_ADMIN_TOKEN", "listen": "127.0.0.1:0"}}`)
	require.NotNil(t, gw.AdminHandler())
	admin := httptest.NewServer(gw.AdminHandler())
	t.Cleanup(admin.Close)

	status, _ := do(t, srv.Client(), adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", `{"limit":1}`))
	assert.Equal(t, http.StatusNotFound, status, "not beside the model API")
	status, _ = do(t, admin.Client(), adminRequest(t, http.MethodPatch, admin.URL+"/admin/orgs/org-a/concurrent-limit", `{"limit":1}`))
	assert.Equal(t, http.StatusOK, status)
	req := adminRequest(t, http.MethodGet, admin.URL+"/debug/slots", "")
	req.Header.Del("Authorization")
	status, _ = do(t, admin.Client(), req)
	assert.Equal(t, http.StatusUnauthorized, status, "its own listener still needs the token")
	assert.Equal(t, 1, gw.orgLimit("org-a"))
}

func TestConfigAdmin(t *testing.T) {
	t.Setenv("GATEWAY_TEST_SHORT_TOKEN", "short")
	t.Setenv("GATEWAY_TEST_SPACED_TOKEN", "admin-token 0123456789")
	t.Setenv("GATEWAY_TEST_CONTROL_TOKEN", "admin-token\x010123456789")
	for _, tc := range []struct{ admin, want string }{
		{`{}`, "config: admin.token or token_env: missing"},
		{`{"token":"short"}`, "config: admin.token: under 16 bytes"},
		{`{"token":"` + testAdminToken + `","token_env":"X"}`, "config: admin.token: set token or token_env, not both"},
		{`{"token_env":"GATEWAY_TEST_NO_SUCH_VARIABLE"}`, "config: admin.token_env: the environment variable GATEWAY_TEST_NO_SUCH_VARIABLE is not set"},
		{`{"token_env":"GATEWAY_TEST_SHORT_TOKEN"}`, "config: admin.token_env: the token in GATEWAY_TEST_SHORT_TOKEN is under 16 bytes"},
		{`{"token_env":"GATEWAY_TEST_SPACED_TOKEN"}`, "config: admin.token_env: the value of GATEWAY_TEST_SPACED_TOKEN: contains whitespace or control characters"},
		{`{"token_env":"GATEWAY_TEST_CONTROL_TOKEN"}`, "config: admin.token_env: the value of GATEWAY_TEST_CONTROL_TOKEN: contains whitespace or control characters"},
		{`{"token":"admin-token 0123456789"}`, "config: admin.token: contains whitespace or control characters"},
	} {
		_, err := ParseConfig([]byte(`{"upstream":"http://x","admin":` + tc.admin + `}`))
		assert.EqualError(t, err, tc.want)
	}
	cfg, err := ParseConfig([]byte(`{"upstream":"http://x","admin":{"token":"` + testAdminToken + `"},"fleet":{"redis_url":"redis://user:hunter2@127.0.0.1:6379/0"}}`))
	require.NoError(t, err)
	shown, err := json.Marshal(cfg.Redacted())
	require.NoError(t, err)
	assert.NotContains(t, string(shown), testAdminToken)
	assert.NotContains(t, string(shown), "hunter2")
	assert.Equal(t, testAdminToken, cfg.Admin.Token, "Redacted leaves the config itself alone")
}

// A token written to a file and read into the variable ends in a newline:
// the token is what is around it.
func TestAdminTokenFromTheEnvironmentIsTrimmed(t *testing.T) {
	t.Setenv("GATEWAY_TEST_FILE_TOKEN", "\t"+testAdminToken+"\n")
	u := newUpstream(t)
	srv, _ := startGatewayWith(t, u.srv.URL, `{"upstream": "%s", "admin": {"token_env": "GATEWAY_TEST_FILE_TOKEN"}}`)
	status, _ := do(t, srv.Client(), adminRequest(t, http.MethodGet, srv.URL+"/debug/provider", ""))
	assert.Equal(t, http.StatusOK, status)
}

// With a fleet, the admin API acts on the fleet: org-a set to 1 through
// gateway 1 is at 1 on gateway 2 too (its GET says so: an override, fleet
// wide, persisted), so two requests for org-a sent at once, one through
// each gateway, get one 200 and one 429; a gateway started after the change
// (as one restarted) has it; a DELETE through gateway 2 puts every gateway
// back on the configured limit. How long gateway 2 took to hold the change
// is logged.
func TestGatewayAdminActsOnTheFleet(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) { testAdminActsOnTheFleet(t, store(t)) })
	}
}

func testAdminActsOnTheFleet(t *testing.T, store string) {
	u := newUpstream(t)
	format := `{
	"upstream": "%s",
	"admin": {"token": "` + testAdminToken + `"},
	"orgs": {"default_limit": 10, "limits": {"org-a": 4}},
	"fleet": {` + store + `}
}`
	gw1, _ := startGatewayWith(t, u.srv.URL, format)
	gw2, _ := startGatewayWith(t, u.srv.URL, format)
	client := gw1.Client()
	const path = orgALimitPath
	limitAt := func(gw *httptest.Server) string { return orgALimitAt(t, client, gw) }
	const overridden = `{"org":"org-a","limit":1,"source":"override","configured":4,"scope":"fleet","persisted":true,"synced":true}`
	const configured = `{"org":"org-a","limit":4,"source":"config","configured":4,"scope":"fleet","persisted":true,"synced":true}`
	assert.JSONEq(t, configured, limitAt(gw2))

	sent := time.Now()
	status, body := do(t, client, adminRequest(t, http.MethodPatch, gw1.URL+path, `{"limit":1}`))
	require.Equal(t, http.StatusOK, status, body)
	assert.JSONEq(t, overridden, body)
	waitFor(t, "gateway 2 holds the change", func() bool { return limitAt(gw2) == limitAt(gw1) })
	t.Logf("gateway 2 held the change %v after the PATCH was sent to gateway 1", time.Since(sent).Round(time.Millisecond))
	assert.JSONEq(t, overridden, limitAt(gw2))

	codes := make([]int, 2)
	bodies := make([]io.ReadCloser, 2)
	var wg sync.WaitGroup
	for i, gw := range []*httptest.Server{gw1, gw2} {
		wg.Go(func() {
			resp, err := post(context.Background(), t, client, gw.URL, "org-a", "glm-5.3")
			if assert.NoError(t, err) {
				codes[i], bodies[i] = resp.StatusCode, resp.Body
			}
		})
	}
	wg.Wait()
	slices.Sort(codes)
	assert.Equal(t, []int{http.StatusOK, http.StatusTooManyRequests}, codes, "org-a's limit of 1 holds across the fleet")
	close(u.gate)
	for _, b := range bodies {
		if b != nil {
			_, _ = io.Copy(io.Discard, b)
			b.Close()
		}
	}

	gw3, _ := startGatewayWith(t, u.srv.URL, format)
	assert.JSONEq(t, overridden, limitAt(gw3), "a gateway started later has it")

	status, body = do(t, client, adminRequest(t, http.MethodDelete, gw2.URL+path, ""))
	require.Equal(t, http.StatusOK, status, body)
	assert.JSONEq(t, configured, body)
	for _, gw := range []*httptest.Server{gw1, gw3} {
		waitFor(t, "every gateway is back on the configured limit", func() bool { return limitAt(gw) == limitAt(gw2) })
	}
	status, _ = do(t, client, adminRequest(t, http.MethodDelete, gw1.URL+path, ""))
	assert.Equal(t, http.StatusNotFound, status, "nothing left to remove, fleet-wide")
}

// The fleet's overrides through a Redis that dies and comes back empty:
// a gateway started while it is down says it has not read them (synced
// false) and applies the configured limit; once Redis is back, the gateway
// that kept its copy writes it back, and the new one takes it. An org name
// that is not UTF-8 is a 400, before the store.
func TestGatewayOverridesThroughARedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	u := newUpstream(t)
	format := `{
	"upstream": "%s",
	"admin": {"token": "` + testAdminToken + `"},
	"orgs": {"default_limit": 10, "limits": {"org-a": 4}},
	"fleet": {"redis_url": "redis://` + srv.Addr + `/0"}
}`
	gw1, _ := startGatewayWith(t, u.srv.URL, format)
	client := gw1.Client()
	const path = orgALimitPath
	limitAt := func(gw *httptest.Server) string { return orgALimitAt(t, client, gw) }
	status, body := do(t, client, adminRequest(t, http.MethodPatch, gw1.URL+path, `{"limit":0}`))
	require.Equal(t, http.StatusOK, status, body)
	status, body = do(t, client, adminRequest(t, http.MethodPatch, gw1.URL+"/admin/orgs/%FF/concurrent-limit", `{"limit":0}`))
	assert.Equal(t, http.StatusBadRequest, status, body)

	srv.Kill()
	gw2, _ := startGatewayWith(t, u.srv.URL, format)
	assert.JSONEq(t, `{"org":"org-a","limit":4,"source":"config","configured":4,"scope":"fleet","persisted":true,"synced":false}`, limitAt(gw2))
	status, _ = do(t, client, adminRequest(t, http.MethodPatch, gw2.URL+path, `{"limit":1}`))
	assert.Equal(t, http.StatusServiceUnavailable, status, "the store did not take it")

	srv.Restart() // empty
	const off = `{"org":"org-a","limit":0,"source":"override","configured":4,"scope":"fleet","persisted":true,"synced":true}`
	waitFor(t, "gateway 1 writes its copy back, and gateway 2 takes it", func() bool { return limitAt(gw2) == limitAt(gw1) })
	assert.JSONEq(t, off, limitAt(gw2))
}

// orgALimitPath is the admin path of org-a's limit.
const orgALimitPath = "/admin/orgs/org-a/concurrent-limit"

// orgALimitAt returns gw's answer to a GET of org-a's limit.
func orgALimitAt(t *testing.T, client *http.Client, gw *httptest.Server) string {
	t.Helper()
	status, body := do(t, client, adminRequest(t, http.MethodGet, gw.URL+orgALimitPath, ""))
	require.Equal(t, http.StatusOK, status, body)
	return body
}

// Without a fleet, the admin API holds as many org limits as a fleet does
// (fleet.MaxOverrides), kept in the gateway's memory: past that, a PATCH of
// another org is a 409, as with a fleet, while the orgs it holds can still
// be changed and removed. It used to take every org it was sent, without
// bound.
func TestAdminOrgLimitsWithoutAFleetAreBounded(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, testConfig)
	client := srv.Client()
	ctx := context.Background()
	for i := range fleet.MaxOverrides {
		require.NoError(t, gw.orgs().Set(ctx, fmt.Sprintf("org-%d", i), 1))
	}
	limitPath := func(org string) string { return srv.URL + "/admin/orgs/" + org + "/concurrent-limit" }
	status, body := do(t, client, adminRequest(t, http.MethodPatch, limitPath("one-more"), `{"limit":5}`))
	assert.Equal(t, http.StatusConflict, status, body)
	_, ok := gw.orgs().Get("one-more")
	assert.False(t, ok, "not taken")
	status, body = do(t, client, adminRequest(t, http.MethodPatch, limitPath("org-7"), `{"limit":5}`))
	assert.Equal(t, http.StatusOK, status, body)
	status, body = do(t, client, adminRequest(t, http.MethodDelete, limitPath("org-7"), ""))
	assert.Equal(t, http.StatusOK, status, body)
	status, body = do(t, client, adminRequest(t, http.MethodPatch, limitPath("one-more"), `{"limit":5}`))
	assert.Equal(t, http.StatusOK, status, "a place was freed: %s", body)
}

// An org that no request can carry in X-Org-ID is a 400, not an override
// that never applies: spaces or tabs around it (net/http drops them from
// the header, so " org-a" would be answered 200 and org-a left as it was),
// a control character other than a tab in it (net/http answers 400 to such
// a header). A tab inside is carried.
func TestAdminRefusesOrgsNoRequestCarries(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, testConfig)
	client := srv.Client()
	for _, org := range []string{"%20org-a", "org-a%20", "%09org-a", "org-a%09", "org%0Aa", "org%00a", "org%7Fa"} {
		for _, method := range []string{http.MethodPatch, http.MethodGet, http.MethodDelete} {
			status, body := do(t, client, adminRequest(t, method, srv.URL+"/admin/orgs/"+org+"/concurrent-limit", `{"limit":0}`))
			assert.Equal(t, http.StatusBadRequest, status, "%s %s: %s", method, org, body)
		}
	}
	assert.Empty(t, gw.orgs().(*localOverrides).m, "none taken")
	status, body := do(t, client, adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org%09a/concurrent-limit", `{"limit":0}`))
	assert.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, 0, gw.orgLimit("org\ta"))
}
