package redistest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Main runs a package's tests, for its TestMain: it reports the tests
// skipped for want of a redis-server (ReportSkips) and fails the run if a
// goroutine outlives them (goleak), as goleak.VerifyTestMain does, waiting
// longer for the last ones to end. A go-redis client whose server is gone
// retries its dial in a goroutine of its own that sleeps a second between
// tries and ends at its first wake after the client's Close: later than
// goleak waits by default. Main looks again for up to 3 s before it calls
// what is left a leak.
func Main(m *testing.M, pkg string) {
	code := m.Run()
	ReportSkips(pkg)
	if code == 0 {
		if err := noneLeft(3 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// noneLeft returns nil once no goroutine is left but the test's own, or
// goleak's last error after within.
func noneLeft(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := goleak.Find() // waits a little itself before it errs
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}
