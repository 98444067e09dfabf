module github.com/inflight-go/inflight/examples

go 1.25.0

require (
	github.com/inflight-go/inflight v0.0.0-00010101000000-000000000000
	github.com/inflight-go/inflight/registry/fleet v0.0.0-00010101000000-000000000000
	github.com/inflight-go/inflight/registry/fleet/pgstore v0.0.0-00010101000000-000000000000
	github.com/inflight-go/inflight/sweep/inflightprom v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
	github.com/prometheus/client_golang v1.24.1
	github.com/redis/go-redis/v9 v9.22.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/benbjohnson/clock v1.3.5 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/inflight-go/inflight/registry/fleet/redisstore v0.0.0-00010101000000-000000000000
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.70.1 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)

// The repository's own modules: the examples are developed with them.
replace (
	github.com/inflight-go/inflight => ..
	github.com/inflight-go/inflight/registry/fleet => ../registry/fleet
	github.com/inflight-go/inflight/registry/fleet/pgstore => ../registry/fleet/pgstore
	github.com/inflight-go/inflight/sweep/inflightprom => ../sweep/inflightprom
)

replace github.com/inflight-go/inflight/registry/fleet/redisstore => ../registry/fleet/redisstore
