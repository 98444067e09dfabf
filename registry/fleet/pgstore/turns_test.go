package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Schema revision 4: at driver.MaxTag, finish tags stop moving, so several
// waiters of a flow share one: the first waiter to reach it leaving gives
// no turn back, and the flow's waiters keep their order in the queue. The
// virtual time is set where a long backlog would have moved it.
func TestFlowOrderAtMaxTag(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("x", 1, false), 10*time.Second).Status)
	_, err := admin.Exec(ctx, "UPDATE inflight_key SET vt[1] = $2 WHERE fleet = $1 AND key = 'k'", fastFleet, driver.MaxTag-2.5)
	require.NoError(t, err)
	// Tags: A1 MaxTag-2.5, A2 -1.5, A3 -0.5, A4 and A5 MaxTag; A3 is the
	// first whose finish is MaxTag.
	queue := func(id string) {
		c := kcall(id, 1, true)
		c.Flow = "A"
		require.Equal(t, driver.StatusQueued, admitIn(t, s, c, 10*time.Second).Status)
	}
	for i := 1; i <= 5; i++ {
		queue(fmt.Sprint("A", i))
	}
	_, err = s.Abandon(ctx, []*driver.AbandonCall{{Lease: "A3", Keys: []string{"k"}, Limits: []int{1}, TTL: fastTTL, Claim: fastClaim}})
	require.NoError(t, err)
	queue("A6")
	rows, err := admin.Query(ctx, "SELECT ticket FROM inflight_ticket WHERE fleet = $1 AND key = 'k' ORDER BY rank, tag, seq", fastFleet)
	require.NoError(t, err)
	var order []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		order = append(order, id)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"A1", "A2", "A4", "A5", "A6"}, order)
}
