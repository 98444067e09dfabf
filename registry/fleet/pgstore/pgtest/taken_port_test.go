package pgtest

import (
	"context"
	"testing"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A port taken between freePort's choice and the server's bind (another
// process's, a client connection's) costs a start on another port, not
// the test: PostgreSQL and PgBouncer both exit at once on a port in use.
// Each is given a taken port first.
func TestStartOnAPortTakenMeanwhile(t *testing.T) {
	port := testrig.TakenPort(t)
	picks := 0
	pickPort = func(t tb) int {
		picks++
		if picks == 1 || picks == 3 { // the server's first, and the bouncer's
			return port
		}
		return freePort(t)
	}
	defer func() { pickPort = freePort }()

	s := Start(t)
	assert.NotEqual(t, port, s.port, "the server started on another port")
	url := s.Bouncer()
	assert.Equal(t, 4, picks, "each started again once")
	for _, u := range []string{s.URL, url} {
		conn, err := pgx.Connect(context.Background(), u)
		require.NoError(t, err, u)
		require.NoError(t, conn.Ping(context.Background()))
		require.NoError(t, conn.Close(context.Background()))
	}
}
