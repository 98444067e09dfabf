package redistest_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// childEnv makes the test binary the child that TestReportSkips runs.
const childEnv = "FLEETTEST_SKIPS_CHILD"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if os.Getenv(childEnv) != "" {
			redistest.ReportSkips("redistest")
		}
		os.Exit(code)
	}))
}

// TestReportSkips runs this test binary where no redis-server can be found
// (an empty PATH) and reads the line its TestMain writes.
func TestReportSkips(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestNeedsRedis", "-test.count=1")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir(), childEnv+"=1", "REDISTEST_NO_TTY=1", redistest.RequireEnv+"=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "skipping is not failing:\n%s", out)
	assert.Contains(t, string(out), "redistest: skipped 2 of its tests for want of a redis-server binary (apt-get install redis-server): TestNeedsRedisA, TestNeedsRedisB\n")
}

func TestNeedsRedisA(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestReportSkips")
	}
	redistest.SkipWithoutRedis(t)
	t.Fatal("not skipped without a redis-server on PATH")
}

func TestNeedsRedisB(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestReportSkips")
	}
	redistest.Start(t)
	t.Fatal("not skipped without a redis-server on PATH")
}

// The package's example, run.
func TestFleetOnRedis(t *testing.T) { fleetOnRedis(t) }
