module github.com/inflight-go/inflight/registry/fleet/redisstore

go 1.25.0

// The repository's own modules: the store is developed with them.
replace (
	github.com/inflight-go/inflight => ../../..
	github.com/inflight-go/inflight/registry/fleet => ..
)

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/inflight-go/inflight v0.0.0-00010101000000-000000000000
	github.com/inflight-go/inflight/registry/fleet v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.22.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/benbjohnson/clock v1.3.5 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
