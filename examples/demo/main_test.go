package main

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry/fleet/fleettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs a smaller, faster workload over real HTTP: straight at the
// provider it meets 429s; through the gateway, with one queue or with
// priority classes, it meets none and completes. (The latencies the demo
// prints are not asserted: they depend on the machine.)
func TestDemo(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run([]string{"-batch", "12", "-interactive", "12", "-scale", "0.2"}, &out))
	d, c := lastOutcome.direct, lastOutcome.capped
	assert.Positive(t, d.refused, "the provider refuses some direct requests")
	assert.Zero(t, c.refused)
	assert.Equal(t, c.requests, c.completed)
	assert.LessOrEqual(t, c.peak, int64(5), "never more than the account allows")
	assert.Contains(t, out.String(), "through the gateway")
	for _, r := range []result{lastOutcome.oneQueue, lastOutcome.classes} {
		assert.Zero(t, r.refused, r.name)
		assert.Equal(t, r.requests, r.completed, r.name)
		assert.LessOrEqual(t, r.peak, int64(5), r.name)
	}
	assert.Contains(t, out.String(), "priority classes")
}

func TestDemoFlags(t *testing.T) {
	var usage usageError
	assert.ErrorAs(t, run([]string{"-account-limit", "0"}, &strings.Builder{}), &usage)
	assert.ErrorAs(t, run([]string{"-nope"}, &strings.Builder{}), &usage)
	assert.ErrorAs(t, run([]string{"-scale", "0"}, &strings.Builder{}), &usage)
	assert.ErrorAs(t, run([]string{"-scale", "1e300"}, &strings.Builder{}), &usage)
	assert.ErrorAs(t, run([]string{"-scale", "NaN"}, &strings.Builder{}), &usage)
}

// TestProviderHugeTurn: a turn too long for a time.Duration is a long
// turn, not one that has already ended.
func TestProviderHugeTurn(t *testing.T) {
	srv := httptest.NewServer(&provider{limit: 1})
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"model":"glm-5","turn_ms":9223372036854775807}`))
	require.NoError(t, err)
	client := srv.Client()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n", line)
	cancel()
}

// TestDemoFleet runs the three-gateway part: sharing their caps on one
// redis-server, the gateways see no 429s and never exceed the account.
func TestDemoFleet(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv(fleettest.RequireEnv) != "" {
			t.Fatalf("redis-server not found: %v", err)
		}
		t.Skip("no redis-server binary")
	}
	var out strings.Builder
	require.NoError(t, run([]string{"-batch", "12", "-interactive", "12", "-scale", "0.2", "-fleet"}, &out))
	f := lastOutcome.fleet
	assert.Zero(t, f.refused)
	assert.Equal(t, f.requests, f.completed)
	assert.LessOrEqual(t, f.peak, int64(5), "never more than the account allows, across three gateways")
	assert.Equal(t, f.requests, lastOutcome.perProcess.requests)
	assert.Contains(t, out.String(), "caps on one Redis")
}
