package slots_test

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// Retry-After (whole seconds, rounded up) never says less than
// retry-after-ms, however long the wait: a client that reads the seconds
// must not come back before one that reads the milliseconds. Near the top
// of time.Duration the seconds were rounded down to stay a Duration.
func TestRetryAfterHeadersAgreeAtTheTop(t *testing.T) {
	for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - time.Second + 1, math.MaxInt64 - time.Millisecond} {
		h := http.Header{}
		slots.SetRetryAfter(h, d)
		secs, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
		require.NoError(t, err)
		ms, err := strconv.ParseInt(h.Get(slots.HeaderRetryAfterMs), 10, 64)
		require.NoError(t, err)
		assert.Equal(t, (ms+999)/1000, secs, "SetRetryAfter(%d): Retry-After %d s beside %d ms", d, secs, ms)

		rec := httptest.NewRecorder()
		slots.WriteError(rec, &slots.LimitError{Err: slots.ErrQueueFull, RetryAfter: d})
		secs, err = strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64)
		require.NoError(t, err)
		ms, err = strconv.ParseInt(rec.Header().Get(slots.HeaderRetryAfterMs), 10, 64)
		require.NoError(t, err)
		assert.Equal(t, (ms+999)/1000, secs, "WriteError(%d): Retry-After %d s beside %d ms", d, secs, ms)
	}
}
