package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// authUpstream answers at once and records the Authorization header of
// each request it is sent.
func authUpstream(t *testing.T) (*httptest.Server, func() []string) {
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(up.Close)
	return up, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func TestAPIKeySecretsComeFromTheEnvironment(t *testing.T) {
	const secret = "sk-test-secret-0123456789"
	t.Setenv("GATEWAY_TEST_KEY_1", secret+"\n")

	t.Run("a key's secret is sent upstream and shown nowhere", func(t *testing.T) {
		up, seen := authUpstream(t)
		srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s",
			"admin": {"token": "`+testAdminToken+`"},
			"provider": {"api_keys": [{"id": "k1", "max_concurrent_requests": 2}]},
			"api_key_env": {"k1": "GATEWAY_TEST_KEY_1"}}`)
		client := srv.Client()
		resp, _ := postBody(t, client, srv.URL, "org-a", `{"model":"glm-5"}`, "Authorization", "Bearer client-credential")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, []string{"Bearer " + secret}, seen(), "the secret, trimmed, in place of the client's credential")

		assert.Contains(t, scrape(t, client, srv.URL), `cap="api_key:k1"`)
		assert.NotContains(t, scrape(t, client, srv.URL), secret)
		for _, path := range []string{"/debug/provider", "/debug/slots"} {
			status, body := do(t, client, adminRequest(t, http.MethodGet, srv.URL+path, ""))
			require.Equal(t, http.StatusOK, status)
			assert.NotContains(t, body, secret, path)
		}
	})
	t.Run("a key without a variable sends no Authorization header", func(t *testing.T) {
		up, seen := authUpstream(t)
		srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s",
			"provider": {"api_keys": [{"id": "k2"}]}}`)
		resp, _ := postBody(t, srv.Client(), srv.URL, "org-a", `{"model":"glm-5"}`, "Authorization", "Bearer client-credential")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, []string{""}, seen())
	})
	t.Run("the logged config carries no secret", func(t *testing.T) {
		cfg, err := ParseConfig([]byte(`{"upstream": "http://x",
			"provider": {"api_keys": [{"id": "k1"}]}, "api_key_env": {"k1": "GATEWAY_TEST_KEY_1"}}`))
		require.NoError(t, err)
		shown, err := json.Marshal(cfg.Redacted())
		require.NoError(t, err)
		assert.NotContains(t, string(shown), secret)
		assert.Contains(t, string(shown), `"api_key_env":{"k1":"GATEWAY_TEST_KEY_1"}`)
	})
}

func TestConfigAPIKeyEnv(t *testing.T) {
	t.Setenv("GATEWAY_TEST_EMPTY_KEY", "")
	t.Setenv("GATEWAY_TEST_SPACED_KEY", "sk-one two")
	for _, tc := range []struct{ env, want string }{
		{`{"k1": "GATEWAY_TEST_NO_SUCH_VARIABLE"}`, `config: api_key_env["k1"]: the environment variable GATEWAY_TEST_NO_SUCH_VARIABLE is not set`},
		{`{"k1": "GATEWAY_TEST_EMPTY_KEY"}`, `config: api_key_env["k1"]: the environment variable GATEWAY_TEST_EMPTY_KEY is not set`},
		{`{"k1": "GATEWAY_TEST_SPACED_KEY"}`, `config: api_key_env["k1"]: the value of GATEWAY_TEST_SPACED_KEY: contains whitespace or control characters`},
		{`{"k9": "GATEWAY_TEST_SPACED_KEY"}`, `config: api_key_env["k9"]: no key with this id in provider.api_keys`},
		{`{"k1": ""}`, `config: api_key_env["k1"]: missing the variable's name`},
	} {
		_, err := ParseConfig([]byte(`{"upstream": "http://x", "provider": {"api_keys": [{"id": "k1"}]}, "api_key_env": ` + tc.env + `}`))
		assert.EqualError(t, err, tc.want)
		if err != nil {
			assert.False(t, strings.Contains(err.Error(), "sk-one"), "no secret in the error")
		}
	}
}

func TestConfigRedactsURLs(t *testing.T) {
	_, err := ParseConfig([]byte(`{"upstream": "http://x", "fleet": {"redis_url": "redis://:hunter2@127.0.0.1:notaport/0"}}`))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2")
	assert.Contains(t, err.Error(), "config: fleet.redis_url: not a valid redis URL")

	cfg, err := ParseConfig([]byte(`{"upstream": "https://user:upstream-pass@api.example.com/v1"}`))
	require.NoError(t, err)
	shown, err := json.Marshal(cfg.Redacted())
	require.NoError(t, err)
	assert.NotContains(t, string(shown), "upstream-pass")
	assert.Contains(t, string(shown), `"upstream":"https://user:xxxxx@api.example.com/v1"`)
	assert.Equal(t, "https://user:upstream-pass@api.example.com/v1", cfg.Upstream, "Redacted leaves the config itself alone")
}

// The configuration is one JSON object and nothing after it (before, a
// stray '}' or a second object after it was not read, and not refused).
func TestConfigRefusesDataAfterTheObject(t *testing.T) {
	for _, js := range []string{`{"upstream": "http://x"}}`, `{"upstream": "http://x"} {"upstream": "http://y"}`} {
		_, err := ParseConfig([]byte(js))
		assert.ErrorContains(t, err, "config: data after the JSON object", js)
	}
	_, err := ParseConfig([]byte("{\"upstream\": \"http://x\"}\n"))
	assert.NoError(t, err)
}

// A listen address left empty, or an upstream that is no HTTP URL, is
// refused at load: net.Listen takes "" as every interface on a random
// port, and a typo in the scheme loaded, then answered every request 502.
func TestConfigRefusesAnEmptyListenAndANonHTTPUpstream(t *testing.T) {
	_, err := ParseConfig([]byte(`{"upstream": "http://x", "listen": ""}`))
	assert.ErrorContains(t, err, "config: listen: empty")
	for _, up := range []string{"htp://127.0.0.1:9000", "ws://127.0.0.1:9000", "redis://127.0.0.1:6379"} {
		_, err := ParseConfig([]byte(`{"upstream": "` + up + `"}`))
		assert.ErrorContains(t, err, "config: upstream:", up)
	}
	cfg, err := ParseConfig([]byte(`{"upstream": "HTTPS://api.example.com"}`))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8080", cfg.Listen, "left out, the default")
}

// A request that goes ahead without a slot after the longest wait
// (on_wait_timeout "proceed") is granted no key of the pool: it goes with
// no credential, never with the client's own.
func TestBypassUnderAKeyPoolSendsNoClientCredential(t *testing.T) {
	t.Setenv("GATEWAY_TEST_KEY_P", "sk-pool")
	var mu sync.Mutex
	var seen []string
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		first := len(seen) == 1
		mu.Unlock()
		arrived <- struct{}{}
		if first {
			<-release // holds the one slot
		}
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(up.Close)
	srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s",
		"provider": {"max_concurrent_requests": 1, "max_queue_wait_ms": 50, "on_wait_timeout": "proceed",
			"api_keys": [{"id": "k1", "max_concurrent_requests": 1}]},
		"api_key_env": {"k1": "GATEWAY_TEST_KEY_P"}}`)
	firstDone := make(chan int, 1)
	go func() {
		resp, _ := postBody(t, srv.Client(), srv.URL, "org-a", `{"model":"glm-5"}`, "Authorization", "Bearer the-clients-own")
		firstDone <- resp.StatusCode
	}()
	<-arrived
	resp, _ := postBody(t, srv.Client(), srv.URL, "org-a", `{"model":"glm-5"}`, "Authorization", "Bearer the-clients-own")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "went ahead after its wait")
	close(release)
	assert.Equal(t, http.StatusOK, <-firstDone)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"Bearer sk-pool", ""}, seen, "the pool's key, then none")
}

// A name that no request can carry is refused in the configuration, not
// kept as a cap that never applies: a model or an org over 256 bytes (a
// request naming one is answered 400), an empty one (a request without
// X-Org-ID is the org "default"; one without a model takes the
// provider's caps alone), an org with spaces or tabs around it or a
// control character other than a tab in it (net/http drops the former
// from an X-Org-ID header, and answers 400 to a header with the latter).
func TestConfigRefusesNamesNoRequestCarries(t *testing.T) {
	long := strings.Repeat("m", 257)
	for _, tc := range []struct{ json, err string }{
		{`{"provider": {"models": {"` + long + `": {"max_concurrent_requests": 1}}}}`, `config: provider: models["mmm`},
		{`{"provider": {"models": {"": {"max_concurrent_requests": 1}}}}`, `config: provider: pacing: models: "" is not a model's name`},
		{`{"orgs": {"limits": {"` + long + `": 1}}}`, `config: orgs.limits["mmm`},
		{`{"orgs": {"limits": {"": 1}}}`, `config: orgs.limits[""]: not an org's name (1 to 256 bytes)`},
		{`{"orgs": {"priorities": {"": "batch"}}}`, `config: orgs.priorities[""]: not an org's name`},
		{`{"orgs": {"weights": {"` + long + `": 2}}}`, `config: orgs.weights["mmm`},
		{`{"orgs": {"budgets": {"": {"tokens_per_minute": 10}}}}`, `config: orgs.budgets[""]: not an org's name`},
		{`{"orgs": {"limits": {" org-a": 1}}}`, `config: orgs.limits[" org-a"]: not an org's name`},
		{`{"orgs": {"limits": {"org-a\t": 1}}}`, `config: orgs.limits["org-a\t"]: not an org's name`},
		{`{"orgs": {"priorities": {"org\na": "batch"}}}`, `config: orgs.priorities["org\na"]: not an org's name`},
		{`{"orgs": {"weights": {"org\u0000a": 2}}}`, `config: orgs.weights["org\x00a"]: not an org's name`},
		{`{"orgs": {"budgets": {"org\u007fa": {"tokens_per_minute": 10}}}}`, `config: orgs.budgets["org\x7fa"]: not an org's name`},
	} {
		js := `{"upstream": "http://x", ` + tc.json[1:]
		_, err := ParseConfig([]byte(js))
		assert.ErrorContains(t, err, tc.err, tc.json)
	}
	// 256 bytes is a name; so is one with a tab inside.
	_, err := ParseConfig([]byte(`{"upstream": "http://x", "orgs": {"limits": {"` + long[:256] + `": 1, "org\ta": 1}}, "provider": {"models": {"` + long[:256] + `": {}}}}`))
	assert.NoError(t, err)
}
