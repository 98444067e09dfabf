package redisstore

import (
	"testing"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

func TestMain(m *testing.M) {
	redistest.Main(m, "registry/fleet/redisstore")
}
