package fleet

import (
	"errors"
	"net/http"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A caller refused while the store cannot be reached (FailClosed) is told
// to come back after about as long as the store has failed so far: the
// probe interval at first, longer as the outage goes on (30 s at most),
// each spread over half as long again, so that callers refused together
// come back apart; short again once the store has answered. HTTPStatus
// answers it 503 with that Retry-After.
func TestUnavailableRetryAfterFollowsTheOutage(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		st := memstore.New()
		r := New[string](st, 4, WithUnavailable(FailClosed), WithLogger(quiet()))
		t.Cleanup(r.Close)
		refused := func() (time.Duration, error) {
			t.Helper()
			_, err := r.TryAcquire("k")
			var down *UnavailableError
			require.True(t, errors.As(err, &down), "not refused as unavailable: %v", err)
			require.ErrorIs(t, err, ErrUnavailable)
			return down.RetryAfter(), err
		}
		within := func(d, lo time.Duration, what string) {
			t.Helper()
			assert.GreaterOrEqual(t, d, lo, what)
			assert.LessOrEqual(t, d, lo+lo/2, what)
		}

		st.Kill()
		d, _ := refused()
		within(d, defaultProbeEvery, "the first refusal: the probe interval")

		time.Sleep(4 * time.Second) // the probes fail meanwhile
		require.True(t, r.Stats().BreakerOpen)
		var told []time.Duration
		for range 50 {
			d, _ := refused()
			within(d, 4*time.Second, "four seconds into the outage")
			told = append(told, d)
		}
		slices.Sort(told)
		assert.Greater(t, told[len(told)-1]-told[0], time.Second, "spread over the two seconds after four: %v", told)
		assert.Greater(t, len(slices.Compact(told)), 40, "fifty callers told apart")

		time.Sleep(2 * time.Minute)
		d, err := refused()
		within(d, maxOutageRetry, "past 30 s of outage: 30 s at most")
		status, retryAfter := slots.HTTPStatus(err)
		assert.Equal(t, http.StatusServiceUnavailable, status)
		assert.Equal(t, d.Truncate(time.Second)+time.Second, retryAfter, "whole seconds, rounded up")

		st.Restart()
		time.Sleep(time.Second) // a probe gets an answer
		synctest.Wait()
		require.False(t, r.Stats().BreakerOpen)
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		s.Release()
		st.Kill()
		d, _ = refused()
		within(d, defaultProbeEvery, "a new outage starts short again")
	})
}
