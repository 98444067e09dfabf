package sweep_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
)

func getHolders(t *testing.T, url string) (int, sweep.HoldersJSON, map[string]any) {
	t.Helper()
	// No kept-alive connection is left for goleak to find.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out sweep.HoldersJSON
	var loose map[string]any
	if resp.StatusCode == http.StatusOK {
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.NoError(t, json.Unmarshal(raw, &out))
		require.NoError(t, json.Unmarshal(raw, &loose))
	}
	return resp.StatusCode, out, loose
}

func TestHandler(t *testing.T) {
	mock := clock.NewMock()
	reg := registry.New[string](8, slots.WithClock(mock))
	srv := httptest.NewServer(sweep.Handler(reg, sweep.WithClock(mock), sweep.WithThreshold(time.Minute)))
	t.Cleanup(srv.Close)

	t.Run("nothing held is an empty list, not null", func(t *testing.T) {
		status, out, loose := getHolders(t, srv.URL)
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, 0, out.InUse)
		assert.Equal(t, []any{}, loose["holders"])
	})

	old, err := reg.TryAcquire("org-a/glm-5")
	require.NoError(t, err)
	defer old.Release()
	mock.Add(90 * time.Second)
	both, err := reg.AcquireAll(t.Context(), "org-b/glm-5", "provider")
	require.NoError(t, err)
	defer both.Release()
	mock.Add(1500 * time.Millisecond)

	t.Run("holders oldest first, ages in seconds, long-held marked", func(t *testing.T) {
		status, out, loose := getHolders(t, srv.URL)
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, 3, out.InUse, "a two-key slot counts per key")
		assert.Equal(t, 3, out.Keys)
		assert.Equal(t, 1, out.LongHeld)
		assert.Equal(t, 60.0, out.ThresholdSeconds)
		assert.False(t, out.Truncated)
		require.Len(t, out.Holders, 3)
		assert.Equal(t, "org-a/glm-5", out.Holders[0].Key)
		assert.Equal(t, 91.5, out.Holders[0].AgeSeconds)
		assert.True(t, out.Holders[0].LongHeld)
		assert.Equal(t, 1.5, out.Holders[1].AgeSeconds)
		assert.False(t, out.Holders[1].LongHeld)
		assert.Equal(t, out.Holders[1].SlotID, out.Holders[2].SlotID, "one slot under two keys has one id")
		assert.ElementsMatch(t, []string{"org-b/glm-5", "provider"}, []string{out.Holders[1].Key, out.Holders[2].Key})
		assert.Equal(t, mock.Now().UTC(), out.Now)
		first := loose["holders"].([]any)[0].(map[string]any)
		assert.ElementsMatch(t, []string{"key", "slot_id", "acquired_at", "age_seconds", "long_held"}, keysOf(first), "one naming style")
	})
	t.Run("limit lists the oldest and says the list is cut", func(t *testing.T) {
		status, out, _ := getHolders(t, srv.URL+"?limit=1")
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, 3, out.InUse)
		assert.True(t, out.Truncated)
		require.Len(t, out.Holders, 1)
		assert.Equal(t, "org-a/glm-5", out.Holders[0].Key)
	})
	t.Run("a bad limit is a 400", func(t *testing.T) {
		status, _, _ := getHolders(t, srv.URL+"?limit=-1")
		assert.Equal(t, http.StatusBadRequest, status)
	})
}

func TestLimiterHandler(t *testing.T) {
	mock := clock.NewMock()
	lim := slots.NewLimiter(2, slots.WithClock(mock))
	s, err := lim.TryAcquire()
	require.NoError(t, err)
	defer s.Release()
	mock.Add(2 * time.Second)
	srv := httptest.NewServer(sweep.LimiterHandler(lim, sweep.WithClock(mock)))
	t.Cleanup(srv.Close)
	status, out, _ := getHolders(t, srv.URL)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, 1, out.InUse)
	assert.Equal(t, 0, out.Keys, "a Limiter has no keys")
	require.Len(t, out.Holders, 1)
	assert.Equal(t, 2.0, out.Holders[0].AgeSeconds)
	assert.Equal(t, float64(sweep.DefaultThreshold/time.Second), out.ThresholdSeconds)
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
