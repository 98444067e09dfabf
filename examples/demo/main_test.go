package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(demoArgs); ok { // the demo, run by TestDemoStopsItsStoreOnSignal
		if err := run(strings.Fields(args), os.Stdout, io.Discard); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	redistest.Main(m, "examples/demo")
}

// demoArgs, set, makes the test binary run the demo with its flags.
const demoArgs = "INFLIGHT_DEMO_ARGS"

// TestDemoStopsItsStoreOnSignal ends the demo with SIGTERM while its
// moving cap's part runs on a redis-server it started: the server stops
// and its temporary directory goes with it.
func TestDemoStopsItsStoreOnSignal(t *testing.T) {
	redistest.SkipWithoutRedis(t)
	if runtime.GOOS != "linux" {
		t.Skip("finds a left server by its working directory in /proc")
	}
	tmp := t.TempDir()
	t.Cleanup(func() { killUnder(tmp) }) // a server left, if the test fails
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), demoArgs+"=-batch 0 -interactive 0 -tokens 0 -phase 1m -fleet", "TMPDIR="+tmp)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	moving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "a provider whose cap is hidden and moves") {
				close(moving)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	select {
	case <-moving:
	case <-time.After(time.Minute):
		t.Fatal("the moving cap's part did not start")
	}
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.NotEmpty(t, left, "the redis-server's directory, while it runs")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-exited:
		exited <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("the demo did not end on SIGTERM")
	}
	left, err = os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "the redis-server's directory is removed")
	assert.Empty(t, killUnder(tmp), "no server left running")
}

// killUnder kills the processes working in a directory under dir (the
// redis-servers the demo started there), and returns their ids.
func killUnder(dir string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cwd")
	for _, p := range procs {
		cwd, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(cwd, dir+string(filepath.Separator)) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			pids = append(pids, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return pids
}

// TestDemo runs a smaller, faster workload over real HTTP: straight at the
// provider it meets 429s; through the gateway, with one queue or with
// priority classes, it meets none and completes. (The latencies the demo
// prints are not asserted: they depend on the machine.)
func TestDemo(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run([]string{"-batch", "12", "-interactive", "12", "-scale", "0.2", "-phase", "0"}, &out, io.Discard))
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
	// The token run: straight at a server that holds 20,000 tokens, the
	// large prompts overload it; through the gateway, never.
	td, tc := lastOutcome.tokensDirect, lastOutcome.tokensCapped
	assert.Positive(t, td.refused, "the server refuses some direct requests")
	assert.Greater(t, td.tokenPeak, int64(20000), "asked to hold more than its cache")
	assert.Zero(t, tc.refused)
	assert.Equal(t, tc.requests, tc.completed)
	assert.LessOrEqual(t, tc.tokenPeak, int64(20000))
	assert.Contains(t, out.String(), "  peak tokens held    the most tokens the server was asked to hold at once")
	// The demo says what each run is and what each column means.
	for _, said := range []string{
		"a client retries a 429\n                       twice",
		"the gateway caps the provider at 5 and glm-5 at 3",
		"  peak open at provider  the most requests the provider had open at once",
		"  interactive p50, p95   latencies of the completed interactive turns",
		"  batch p95  the 95th percentile latency of the completed batch turns",
	} {
		assert.Contains(t, out.String(), said)
	}
}

func TestDemoFlags(t *testing.T) {
	var usage usageError
	assert.ErrorAs(t, run([]string{"-account-limit", "0"}, &strings.Builder{}, io.Discard), &usage)
	assert.ErrorAs(t, run([]string{"-nope"}, &strings.Builder{}, io.Discard), &usage)
	assert.ErrorAs(t, run([]string{"-scale", "0"}, &strings.Builder{}, io.Discard), &usage)
	assert.ErrorAs(t, run([]string{"-scale", "1e300"}, &strings.Builder{}, io.Discard), &usage)
	assert.ErrorAs(t, run([]string{"-scale", "NaN"}, &strings.Builder{}, io.Discard), &usage)
	assert.ErrorAs(t, run([]string{"-phase", "-1s"}, &strings.Builder{}, io.Discard), &usage)
	assert.ErrorAs(t, run([]string{"-phase", "1000h"}, &strings.Builder{}, io.Discard), &usage)
	assert.ErrorAs(t, run([]string{"-tokens", "-1"}, &strings.Builder{}, io.Discard), &usage)
}

// -fleet is a boolean flag: "-fleet postgres" is -fleet (Redis) and an
// argument, which the demo must refuse rather than run on Redis.
func TestDemoRefusesArguments(t *testing.T) {
	var usage usageError
	err := run([]string{"-batch", "0", "-interactive", "0", "-tokens", "0", "-phase", "0", "-fleet", "postgres"}, &strings.Builder{}, io.Discard)
	require.ErrorAs(t, err, &usage)
	assert.ErrorContains(t, err, "-fleet=postgres")
}

// A cache too small for the token run's requests is refused up front: the
// gateway would turn every request away as heavier than its cap, and the
// demo fail at the end of the run.
func TestDemoRefusesATinyCache(t *testing.T) {
	var usage usageError
	assert.ErrorAs(t, run([]string{"-batch", "0", "-interactive", "0", "-phase", "0", "-tokens", "100"}, &strings.Builder{}, io.Discard), &usage)
}

// A percentile is the nearest rank: the 95th of six latencies is the
// slowest, not the second slowest.
func TestPercentile(t *testing.T) {
	six := []time.Duration{1, 2, 3, 4, 5, 6}
	assert.Equal(t, time.Duration(6), percentile(six, 95))
	assert.Equal(t, time.Duration(3), percentile(six, 50))
	var forty []time.Duration
	for i := range 40 {
		forty = append(forty, time.Duration(i+1))
	}
	assert.Equal(t, time.Duration(38), percentile(forty, 95))
	assert.Equal(t, time.Duration(20), percentile(forty, 50))
	assert.Equal(t, time.Duration(1), percentile(forty[:1], 95))
}

func TestDemoHelpListsTheFlags(t *testing.T) {
	var stderr strings.Builder
	require.NoError(t, run([]string{"-h"}, io.Discard, &stderr))
	for _, f := range []string{"-batch", "-interactive", "-account-limit", "-model-cap", "-scale", "-seed", "-phase", "-fleet"} {
		assert.Contains(t, stderr.String(), f)
	}
}

// TestDemoShowsProgress: away from a terminal, each phase prints progress
// lines (requests ended, open at the provider, 429s so far) as it runs.
func TestDemoShowsProgress(t *testing.T) {
	var stderr strings.Builder
	require.NoError(t, run([]string{"-batch", "4", "-interactive", "4", "-scale", "0.1", "-phase", "300ms"}, io.Discard, &stderr))
	for _, phase := range []string{"direct", "through the gateway", "one queue", "priority classes"} {
		assert.Regexp(t, phase+` +8 of 8 requests ended \(completed or failed\), +\d+ open at the provider now, +\d+ upstream 429s so far`, stderr.String())
	}
	// One line for the four runs of the moving cap, each run's figures
	// named.
	n := 4 * lastOutcome.moving[0].requests
	assert.Regexp(t, fmt.Sprintf(`hidden cap moving, the 4 runs together %d of %d requests ended \(completed or failed\), at each run's provider now `+
		`\(static cap 5: \d+ open, \d+ 429s; static cap 20: \d+ open, \d+ 429s; static cap 40: \d+ open, \d+ 429s; learned \(adaptive\): \d+ open, \d+ 429s\)`, n, n), stderr.String())
}

// TestDemoMovingCap runs the moving cap's part with phases of 2 s, on a
// real clock, and checks what holds on any machine: the static caps are
// never exceeded at their providers (so the cap of 5, under every hidden
// one, meets no 429s), the learned cap lets work through and is read at
// the end of each phase, and nothing is left held (runMoving fails
// otherwise). How well the cap is learned is scored in virtual time, where
// a busy machine does not move the figures: pacing's TestLearnedCapScore
// for the Gate, examples/internal/gateway's TestGatewayLiveDrop through the
// gateway. The table is logged.
func TestDemoMovingCap(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run([]string{"-batch", "0", "-interactive", "0", "-phase", "2s"}, &out, io.Discard))
	t.Log("\n" + out.String())
	require.Len(t, lastOutcome.moving, 4)
	checkMoving(t, lastOutcome.moving)
	assert.Zero(t, lastOutcome.moving[0].refused, "a cap under every hidden one meets no 429s")
	assert.Contains(t, out.String(), "learned (adaptive)")
	assert.Contains(t, out.String(), "  turned away    turns the gateway refused itself")
}

// checkMoving checks the moving cap's runs: a static cap is never exceeded
// at its provider (counting the requests it refuses: what the gateway
// sent); a learned one lets work through, and was read at the end of each
// phase; no turn is counted both completed and turned away.
func checkMoving(t *testing.T, runs []movingResult) {
	t.Helper()
	for _, r := range runs {
		assert.LessOrEqual(t, r.completed+r.turned, r.requests, r.name)
		if r.learnedAt == nil {
			assert.LessOrEqual(t, r.peak, r.static, "%s: open at the provider", r.name)
			continue
		}
		assert.Positive(t, r.completed, r.name)
		assert.Len(t, r.learnedAt, len(movingCaps), r.name)
	}
}

// TestDemoFleet runs the three-gateway parts: sharing their caps on one
// redis-server, the gateways see no 429s and never exceed the account, nor
// the self-hosted server's cache in the token run.
func TestDemoFleet(t *testing.T) {
	redistest.SkipWithoutRedis(t)
	fleetPart(t, "-fleet", "Redis")
}

// TestDemoFleetPostgres is TestDemoFleet with -fleet=postgres: the three
// gateways share their caps on a PostgreSQL server.
func TestDemoFleetPostgres(t *testing.T) {
	pgtest.SkipWithout(t)
	fleetPart(t, "-fleet=postgres", "PostgreSQL")
}

// fleetPart runs the demo's three-gateway part with flag, and checks it
// on the store named label.
func fleetPart(t *testing.T, flag, label string) {
	t.Helper()
	var out strings.Builder
	require.NoError(t, run([]string{"-batch", "12", "-interactive", "12", "-scale", "0.2", "-phase", "0", flag}, &out, io.Discard))
	f := lastOutcome.fleet
	assert.Zero(t, f.refused)
	assert.Equal(t, f.requests, f.completed)
	assert.LessOrEqual(t, f.peak, int64(5), "never more than the account allows, across three gateways")
	assert.Equal(t, f.requests, lastOutcome.perProcess.requests)
	assert.Contains(t, out.String(), "caps on one "+label)
	// The token run through three gateways that share max_inflight_tokens:
	// the server is never asked to hold more than its cache.
	tf := lastOutcome.tokensFleet
	assert.Positive(t, tf.requests)
	assert.Zero(t, tf.refused, "the server refused nothing")
	assert.Equal(t, tf.requests, tf.completed)
	assert.LessOrEqual(t, tf.tokenPeak, int64(20000), "never more than its cache, across three gateways")
	assert.Contains(t, out.String(), "three gateways that share max_inflight_tokens")
}

// TestDemoMovingCapFleet runs the moving cap's part with -fleet: three
// gateways learning one cap on one redis-server, beside the other runs,
// checked as TestDemoMovingCap checks them. How well a fleet learns depends
// on how fast Redis answers, so on how busy the machine is: it is scored in
// virtual time by registry/fleet's TestFleetLearnsAMovingCapVirtual. The
// table is logged.
func TestDemoMovingCapFleet(t *testing.T) {
	redistest.SkipWithoutRedis(t)
	var out strings.Builder
	require.NoError(t, run([]string{"-batch", "0", "-interactive", "0", "-phase", "2s", "-fleet"}, &out, io.Discard))
	t.Log("\n" + out.String())
	require.Len(t, lastOutcome.moving, 5)
	checkMoving(t, lastOutcome.moving)
	assert.Equal(t, "learned, 3 gateways, one Redis", lastOutcome.moving[3].name)
}
