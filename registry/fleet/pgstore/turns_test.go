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

// A ticket of several keys costs each key's turn by that key's limit: 3
// units are 3 steps of a key of 3, and 1 of a key of 3,000.
func TestTurnCostPerKey(t *testing.T) {
	s, admin := fastStore(t)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("x", 3, 3, false), 10*time.Second).Status)
	c := ucall("A1", 3, 3, true)
	c.Keys, c.Limits, c.Flow = []string{"k", "j"}, []int{3, 3000}, "A"
	require.Equal(t, driver.StatusQueued, admitIn(t, s, c, 10*time.Second).Status)
	for key, want := range map[string]float64{"k": 3, "j": 1} {
		var got float64
		require.NoError(t, admin.QueryRow(context.Background(), "SELECT finish FROM inflight_flow WHERE fleet = $1 AND key = $2 AND flow = 'A'",
			fastFleet, key).Scan(&got))
		assert.Equal(t, want, got, key)
	}
}
