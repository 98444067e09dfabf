package fleet

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry/fleet/fleettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		fleettest.ReportSkips("registry/fleet")
		os.Exit(code)
	}))
}
