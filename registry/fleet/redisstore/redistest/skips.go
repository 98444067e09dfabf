package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// noTTYEnv keeps ReportSkips off the terminal, for this package's own test
// of it.
const noTTYEnv = "REDISTEST_NO_TTY"

var (
	skipMu  sync.Mutex
	skipped []string // the tests skipped for want of a redis-server binary
)

// SkipWithoutRedis skips t when there is no redis-server binary on PATH,
// noting its name for ReportSkips; with INFLIGHT_REQUIRE_REDIS set it fails
// t instead. Start does the same before it starts a server.
func SkipWithoutRedis(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("redis-server not found, and %s is set: %v", RequireEnv, err)
		}
		skipMu.Lock()
		skipped = append(skipped, t.Name())
		skipMu.Unlock()
		t.Skipf("redis-server not found (install it, e.g. apt-get install redis-server): %v", err)
	}
}

// ReportSkips says in one line which tests of pkg were skipped for want of
// a redis-server binary, if any were. Call it from TestMain once the tests
// have run. go test shows a passing package's output only with -v, so the
// line also goes to the terminal (/dev/tty) when there is one.
func ReportSkips(pkg string) {
	skipMu.Lock()
	names := append([]string(nil), skipped...)
	skipMu.Unlock()
	if len(names) == 0 {
		return
	}
	line := fmt.Sprintf("%s: skipped %d of its tests for want of a redis-server binary (apt-get install redis-server): %s\n",
		pkg, len(names), strings.Join(names, ", "))
	os.Stdout.WriteString(line)
	if os.Getenv(noTTYEnv) != "" {
		return
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		tty.WriteString(line)
		tty.Close()
	}
}
