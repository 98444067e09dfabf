package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// openAIError is the body of an error answer.
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
		Cap     string  `json:"cap"`
		Reason  string  `json:"reason"`
	} `json:"error"`
}

func postBody(t *testing.T, client *http.Client, url, org, body string, header ...string) (*http.Response, openAIError) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Org-ID", org)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var e openAIError
	if resp.StatusCode == http.StatusOK {
		// Read to the end: the answer ends after the handler has returned.
		_, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
	} else {
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		assert.NotContains(t, e.Error.Message, "slots:")
		assert.NotContains(t, e.Error.Message, "fleet:")
		assert.NotContains(t, e.Error.Message, "gateway:")
	}
	return resp, e
}

func TestGatewayStatuses(t *testing.T) {
	u := newUpstream(t)
	close(u.gate)
	log, logs := newTestLogger(slog.LevelInfo)
	srv, _ := startGatewayWith(t, u.srv.URL, `{"upstream": "%s", "orgs": {"default_limit": 4, "limits": {"switched-off": 0}}}`, WithLogger(log))
	client := srv.Client()

	t.Run("a body over 8 MiB is a 413", func(t *testing.T) {
		big := `{"model":"glm-5","pad":"` + strings.Repeat("x", maxBodyBytes) + `"}`
		resp, e := postBody(t, client, srv.URL, "org-a", big)
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		assert.Equal(t, "invalid_request_error", e.Error.Type)
		assert.Equal(t, "request body too large: over 8388608 bytes", e.Error.Message)
	})
	t.Run("a body that is not JSON is a 400", func(t *testing.T) {
		resp, e := postBody(t, client, srv.URL, "org-a", "model=glm-5")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "the request body is not a JSON object", e.Error.Message)
	})
	t.Run("an org whose cap is 0 is a 403 without Retry-After, and the rejection is logged", func(t *testing.T) {
		resp, e := postBody(t, client, srv.URL, "switched-off", `{"model":"glm-5"}`)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		assert.Empty(t, resp.Header.Get("Retry-After"))
		assert.Equal(t, "permission_error", e.Error.Type)
		assert.Contains(t, e.Error.Message, "disabled")
		assert.Contains(t, logs.String(), `msg="gateway: request rejected" cap=tenant status=403 reason=limit_reached org=switched-off model=glm-5`)
		assert.Regexp(t, `msg="gateway: request" method=POST path=/v1/chat/completions org=switched-off model=glm-5 status=403 took=\S+ waited=0s refused_by=tenant\n`, logs.String())
	})
	t.Run("a key that differs from a field's name only in case is a 400", func(t *testing.T) {
		// Capped as the one encoding/json reads, sent as the one the
		// upstream reads: refused.
		resp, e := postBody(t, client, srv.URL, "org-a", `{"model":"glm-5","Model":"cheap"}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, `"Model": a key that differs from "model" only in case`, e.Error.Message)
		resp, e = postBody(t, client, srv.URL, "org-a", `{"model":"glm-5","messages":[],"Max_Tokens":1}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, `"Max_Tokens": a key that differs from a field's name only in case`, e.Error.Message)
	})
	t.Run("an org that is not UTF-8 is a 400", func(t *testing.T) {
		resp, e := postBody(t, client, srv.URL, "\xff\xfe", `{"model":"glm-5"}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "X-Org-ID: want UTF-8", e.Error.Message)
	})
	t.Run("a model that is not a string is a 400 that says so", func(t *testing.T) {
		resp, e := postBody(t, client, srv.URL, "org-a", `{"model":5}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "model: want a string", e.Error.Message)
	})
	t.Run("an org or a model over 256 bytes is a 400, before any admission", func(t *testing.T) {
		long := strings.Repeat("o", 257)
		resp, e := postBody(t, client, srv.URL, long, `{"model":"glm-5"}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "X-Org-ID: want a name of at most 256 bytes", e.Error.Message)
		resp, e = postBody(t, client, srv.URL, "org-a", `{"model":"`+long+`"}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "model: want a name of at most 256 bytes", e.Error.Message)
		resp, _ = postBody(t, client, srv.URL, strings.Repeat("o", 256), `{"model":"`+strings.Repeat("m", 256)+`"}`)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "256 bytes are fine")
		assert.NotContains(t, logs.String(), long, "neither was admitted, so neither is in a log line")
	})
	t.Run("a bad X-Priority is a 400", func(t *testing.T) {
		resp, e := postBody(t, client, srv.URL, "org-a", `{"model":"glm-5"}`, "X-Priority", "urgent")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "X-Priority: want interactive, default or batch", e.Error.Message)
	})
	t.Run("a request is logged at info level, the default", func(t *testing.T) {
		resp, _ := postBody(t, client, srv.URL, "org-a", `{"model":"glm-5"}`)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Regexp(t, `msg="gateway: request" method=POST path=/v1/chat/completions org=org-a model=glm-5 status=200 took=\S+ waited=\S+ caps="\[tenant provider\]"\n`, logs.String())
	})
}

// With on_unavailable "closed", a Redis that cannot be reached answers 503
// with Retry-After, not 500; an org switched off is a 403 all the same.
// A refusal is a 403 only at a cap of 0: a wait that timed out, or a full
// queue, with no figures (as a fleet's wait whose tries Redis never
// answered reports it) is retryable.
func TestAdmissionAnswerForbidsOnlyACapOfZero(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
	}{
		{&slots.LimitError{Err: slots.ErrLimitReached, Key: "tenant"}, http.StatusForbidden},
		{&slots.LimitError{Err: slots.ErrLimitReached, Key: "tenant", Limit: 2, InFlight: 2}, http.StatusTooManyRequests},
		{&slots.LimitError{Err: slots.ErrWaitTimeout, Key: "provider"}, http.StatusTooManyRequests},
		{&slots.LimitError{Err: slots.ErrQueueFull, Key: "provider"}, http.StatusTooManyRequests},
	} {
		status, _, _ := admissionAnswer(tc.err)
		assert.Equal(t, tc.status, status, "%v", tc.err)
	}
}

func TestGatewayFleetClosedWithoutRedis(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	u := newUpstream(t)
	close(u.gate)
	srv, gw := startGatewayWith(t, u.srv.URL, `{"upstream": "%s",
		"orgs": {"limits": {"switched-off": 0}},
		"fleet": {"redis_url": "redis://`+addr+`/0", "on_unavailable": "closed"}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	assert.Error(t, gw.Ping(ctx), "Ping tells an unreachable Redis")
	resp, e := postBody(t, srv.Client(), srv.URL, "org-a", `{"model":"glm-5"}`)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	// When to come back: as long as Redis has failed so far, from the
	// fleet's probe interval (250 ms) to 30 s, spread over half as long
	// again (it was a fixed 5 s).
	ms := assertRetryAfter(t, resp.Header)
	assert.GreaterOrEqual(t, ms, 250)
	assert.LessOrEqual(t, ms, 45000)
	assert.Equal(t, "overloaded_error", e.Error.Type)
	assert.Equal(t, "the shared concurrency caps cannot be checked now", e.Error.Message)
	resp, e = postBody(t, srv.Client(), srv.URL, "switched-off", `{"model":"glm-5"}`)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a zero limit is checked before Redis")
	assert.Empty(t, resp.Header.Get("Retry-After"))
	assert.Equal(t, "permission_error", e.Error.Type)
	text := scrape(t, srv.Client(), srv.URL)
	assert.Contains(t, text, `inflight_fleet_degraded{fleet="tenants"}`)
	assert.Contains(t, text, `inflight_fleet_degraded{fleet="provider"}`)
	assert.NotContains(t, text, `inflight_fleet_store_errors_total{fleet="tenants"} 0`, "the failed calls are counted")
}

func TestRejectLogLetsOneLineAPeriodThrough(t *testing.T) {
	l := rejectLog{every: time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ok, n := l.allow(t0)
	assert.True(t, ok)
	assert.Zero(t, n)
	for i := range 5 {
		ok, _ = l.allow(t0.Add(time.Duration(i+1) * 100 * time.Millisecond))
		assert.False(t, ok, "within the second")
	}
	ok, n = l.allow(t0.Add(time.Second))
	assert.True(t, ok)
	assert.Equal(t, 5, n, "the line says how many were held back")
	ok, n = l.allow(t0.Add(3 * time.Second))
	assert.True(t, ok)
	assert.Zero(t, n)
}
