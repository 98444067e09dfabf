package gateway

import (
	"context"
	"encoding/json"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// postgres_listen_url takes a pool's URL as postgres_url does (its pool_*
// settings are not sent to the server), and Ping (the startup check)
// tries it: one that cannot be reached is named, where the gateway would
// otherwise run without wake-ups.
func TestGatewayListenURL(t *testing.T) {
	srv := pgtest.Start(t)
	u := newUpstream(t)
	_, g := startGatewayWith(t, u.srv.URL, `{"upstream": "%s",
	"fleet": {"postgres_url": "`+srv.Bouncer()+`", "postgres_listen_url": "`+srv.URL+`&pool_max_conns=4"}}`)
	require.NoError(t, g.Ping(context.Background()))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, g = startGatewayWith(t, u.srv.URL, `{"upstream": "%s",
	"fleet": {"postgres_url": "`+srv.URL+`", "postgres_listen_url": "postgres://inflight@`+closed+`/inflight?sslmode=disable"}}`)
	assert.ErrorContains(t, g.Ping(context.Background()), "postgres_listen_url")
}

// Whether a connection string sets pgx's query exec mode, in either form,
// whatever else it holds.
func TestNamesExecMode(t *testing.T) {
	for u, want := range map[string]bool{
		"postgres://db/x": false,
		"postgres://db/x?default_query_exec_mode=exec":                            true,
		"postgres://db/x?sslmode=disable&default_query_exec_mode=simple_protocol": true,
		"postgres://default_query_exec_mode:pw@db/default_query_exec_mode":        false,
		"postgres://db/x?default%5Fquery%5Fexec%5Fmode=cache_statement":           true,
		"host=db dbname=x":                         false,
		"host=db default_query_exec_mode=exec":     true,
		"host=db password=default_query_exec_mode": false,
	} {
		assert.Equal(t, want, namesExecMode(u), u)
	}
}

// A keyword/value connection string's password is not logged.
func TestConfigRedactsKeywordPasswords(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"upstream": "http://x", "fleet": {"postgres_url": "host=db user=gw password=hunter2 dbname=gw",
		"postgres_listen_url": "host=db user=gw password='hunter 3' dbname=gw"}}`))
	require.NoError(t, err)
	shown, err := json.Marshal(cfg.Redacted())
	require.NoError(t, err)
	assert.NotContains(t, string(shown), "hunter")
	assert.Contains(t, string(shown), "password=xxxxx dbname=gw")
}
