module github.com/inflight-go/inflight/registry/fleet/pgstore

go 1.25.0

require (
	github.com/inflight-go/inflight v0.0.0-00010101000000-000000000000
	github.com/inflight-go/inflight/registry/fleet v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/benbjohnson/clock v1.3.5 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// The repository's own modules: the store is developed with them.
replace (
	github.com/inflight-go/inflight => ../../..
	github.com/inflight-go/inflight/registry/fleet => ..
	github.com/inflight-go/inflight/registry/fleet/redisstore => ../redisstore
)
