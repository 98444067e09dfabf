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

// redisOf returns r's store, on Redis.
func redisOf[K comparable](r *Registry[K]) *redisStore { return r.store.(*redisStore) }
