package sweep_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
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
		assert.ElementsMatch(t, []string{"key", "slot_id", "units", "acquired_at", "age_seconds", "long_held"}, keysOf(first), "one naming style")
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

// Weighted holders: each holder's units, and their sum, which is what the
// caps count (Stats.InFlight), beside the holders counted; keys that are
// not valid UTF-8 stay apart; a handler of nothing serves no holders.
func TestHandlerUnitsAndOddKeys(t *testing.T) {
	reg := registry.New[string](10)
	heavy, err := reg.TryAcquireN("a\xffb", 8)
	require.NoError(t, err)
	defer heavy.Release()
	light, err := reg.TryAcquire("a\xfeb")
	require.NoError(t, err)
	defer light.Release()
	// A valid key spelled as the invalid one is quoted (before, both read
	// "a\xffb"), and so is one that only starts with a quote.
	spelled, err := reg.TryAcquire(`"a\xffb"`)
	require.NoError(t, err)
	defer spelled.Release()
	quote, err := reg.TryAcquire(`"x`)
	require.NoError(t, err)
	defer quote.Release()
	srv := httptest.NewServer(sweep.Handler(reg))
	t.Cleanup(srv.Close)
	status, out, _ := getHolders(t, srv.URL)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, 4, out.InUse)
	assert.Equal(t, reg.Stats().InFlight, out.Units)
	assert.Equal(t, 11, out.Units)
	units := map[string]int{}
	for _, h := range out.Holders {
		units[h.Key] = h.Units
	}
	assert.Equal(t, map[string]int{`"a\xffb"`: 8, `"a\xfeb"`: 1, `"\"a\\xffb\""`: 1, `"\"x"`: 1}, units, "quoted as Go would, each its own")

	lim := slots.NewLimiter(4)
	s, err := lim.TryAcquireN(3)
	require.NoError(t, err)
	defer s.Release()
	limSrv := httptest.NewServer(sweep.LimiterHandler(lim))
	t.Cleanup(limSrv.Close)
	_, out, _ = getHolders(t, limSrv.URL)
	assert.Equal(t, 3, out.Units)
	require.Len(t, out.Holders, 1)
	assert.Equal(t, 3, out.Holders[0].Units)

	for name, h := range map[string]http.Handler{"Handler": sweep.Handler[string](nil), "LimiterHandler": sweep.LimiterHandler(nil)} {
		rec := httptest.NewRecorder()
		require.NotPanics(t, func() { h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil)) }, name)
		assert.Equal(t, http.StatusOK, rec.Code, name)
		assert.Contains(t, rec.Body.String(), `"holders":[]`, name)
	}
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

// TestHandlerWorkIsBoundedByTheLimit: what a request allocates depends on
// ?limit=, not on how many holders there are (a walk copies one shard at a
// time, and only the listed holders are formatted).
func TestHandlerWorkIsBoundedByTheLimit(t *testing.T) {
	allocs := func(held int) float64 {
		reg := registry.New[string](slots.Unlimited)
		for i := range held {
			s, err := reg.TryAcquire(fmt.Sprintf("org-%d/model", i%1000))
			require.NoError(t, err)
			t.Cleanup(func() { s.Release() })
		}
		h := sweep.Handler(reg)
		req := httptest.NewRequest(http.MethodGet, "/debug/slots?limit=1", nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out sweep.HoldersJSON
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
		require.Equal(t, held, out.InUse)
		require.Equal(t, min(held, 1000), out.Keys)
		require.Len(t, out.Holders, 1)
		return testing.AllocsPerRun(5, func() { h.ServeHTTP(httptest.NewRecorder(), req) })
	}
	small, large := allocs(2_000), allocs(50_000)
	t.Logf("allocations per request with ?limit=1: %.0f for 2,000 holders, %.0f for 50,000", small, large)
	// What is left grows with the size of a shard's copy, not per holder.
	assert.Less(t, large, 50_000/50.0, "fewer than one allocation per 50 holders")
}

func TestHandlerLimit(t *testing.T) {
	reg := registry.New[string](slots.Unlimited)
	for i := range sweep.MaxHandlerLimit + 1 {
		s, err := reg.TryAcquire(fmt.Sprint("org-", i%7))
		require.NoError(t, err)
		t.Cleanup(func() { s.Release() })
	}
	srv := httptest.NewServer(sweep.Handler(reg))
	t.Cleanup(srv.Close)

	for _, q := range []string{"20000", "99999999999999999999999"} {
		t.Run("a limit of "+q+" lists MaxHandlerLimit holders, oldest first", func(t *testing.T) {
			status, out, _ := getHolders(t, srv.URL+"?limit="+q)
			require.Equal(t, http.StatusOK, status)
			assert.Equal(t, sweep.MaxHandlerLimit+1, out.InUse)
			assert.Equal(t, 7, out.Keys)
			assert.True(t, out.Truncated)
			require.Len(t, out.Holders, sweep.MaxHandlerLimit)
			assert.True(t, slices.IsSortedFunc(out.Holders, func(a, b sweep.HolderJSON) int {
				return cmp.Or(a.AcquiredAt.Compare(b.AcquiredAt), cmp.Compare(a.SlotID, b.SlotID))
			}))
		})
	}
	t.Run("limit=0 lists none and says so", func(t *testing.T) {
		status, out, loose := getHolders(t, srv.URL+"?limit=0")
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, sweep.MaxHandlerLimit+1, out.InUse)
		assert.True(t, out.Truncated)
		assert.Equal(t, []any{}, loose["holders"])
	})
	for _, q := range []string{"-1", "ten", "1.5", "+3"} {
		t.Run("limit="+q+" is a 400 in JSON that says what is allowed", func(t *testing.T) {
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := client.Get(srv.URL + "?limit=" + url.QueryEscape(q))
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var body struct {
				Error string `json:"error"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			assert.Equal(t, "limit must be a whole number, 0 or more; at most 10000 holders are listed", body.Error)
		})
	}
}

// TestHandlerListsTheOldest checks the kept holders against a sort of all
// of them, over many shards and ages.
func TestHandlerListsTheOldest(t *testing.T) {
	mock := clock.NewMock()
	reg := registry.New[int](slots.Unlimited, slots.WithClock(mock))
	for i := range 500 {
		mock.Add(time.Duration(i*7919%500) * time.Millisecond) // ages out of key order
		s, err := reg.TryAcquire(i % 97)
		require.NoError(t, err)
		t.Cleanup(func() { s.Release() })
	}
	all := reg.Holders(nil)
	slices.SortFunc(all, func(a, b registry.Holder[int]) int {
		return cmp.Or(a.AcquiredAt.Compare(b.AcquiredAt), cmp.Compare(a.ID, b.ID))
	})
	srv := httptest.NewServer(sweep.Handler(reg, sweep.WithClock(mock)))
	t.Cleanup(srv.Close)
	for _, limit := range []int{1, 37, 499, 500, 501} {
		status, out, _ := getHolders(t, fmt.Sprint(srv.URL, "?limit=", limit))
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, 97, out.Keys)
		want := all[:min(limit, len(all))]
		require.Len(t, out.Holders, len(want), "limit %d", limit)
		for i, h := range out.Holders {
			assert.Equal(t, want[i].ID, h.SlotID, "limit %d, holder %d", limit, i)
		}
		assert.Equal(t, limit < len(all), out.Truncated)
	}
}
