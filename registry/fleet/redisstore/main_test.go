package redisstore

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		redistest.ReportSkips("registry/fleet/redisstore")
		os.Exit(code)
	}))
}
