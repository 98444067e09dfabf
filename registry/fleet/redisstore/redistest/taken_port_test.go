package redistest

import (
	"context"
	"testing"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A port taken between freePort's choice and the server's bind (a client
// connection's, say) costs a start on another port, not the test:
// redis-server exits at once on a port in use.
func TestStartOnAPortTakenMeanwhile(t *testing.T) {
	SkipWithoutRedis(t)
	port := testrig.TakenPort(t)
	picks := 0
	pickPort = func(t testing.TB) int {
		picks++
		if picks == 1 {
			return port
		}
		return freePort(t)
	}
	defer func() { pickPort = freePort }()

	s := Start(t)
	assert.NotEqual(t, port, s.port, "started on another port")
	assert.Equal(t, 2, picks, "started again once")
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	require.NoError(t, c.Ping(context.Background()).Err())
}
