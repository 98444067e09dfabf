package pacing_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// exampleConfig is the shape the gateway's configuration uses.
const exampleConfig = `{
	"max_concurrent_requests": 5,
	"requests_per_minute": 40,
	"min_interval_ms": 1500,
	"max_queue": 256,
	"max_queue_wait_ms": 60000,
	"on_wait_timeout": "reject",
	"api_keys": [{"id": "k1", "max_concurrent_requests": 3}],
	"models": {"glm-5.3": {"max_concurrent_requests": 2, "min_interval_ms": 0}}
}`

func TestParse(t *testing.T) {
	c, err := pacing.Parse([]byte(exampleConfig))
	require.NoError(t, err)
	assert.Equal(t, 5, c.MaxConcurrentRequests)
	assert.Equal(t, []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 3}}, c.APIKeys)
	assert.Equal(t, 2, c.Models["glm-5.3"].MaxConcurrentRequests)
	assert.False(t, c.FailOpen())

	empty, err := pacing.Parse([]byte(`{}`))
	require.NoError(t, err, "every field is optional")
	assert.Zero(t, empty.Interval(), "unset pacing is off")
	assert.Equal(t, pacing.DefaultMaxQueue, empty.QueueLimit())
	assert.Equal(t, pacing.DefaultMaxQueueWait, empty.QueueWait())

	_, err = pacing.Parse([]byte(`{"max_concurent_requests": 5}`))
	assert.ErrorContains(t, err, "max_concurent_requests", "a misspelt field is an error, not a switched-off cap")
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct{ json, field string }{
		{`{"max_concurrent_requests": -1}`, "max_concurrent_requests: -1 is negative"},
		{`{"requests_per_minute": 60001}`, "requests_per_minute: 60001 is outside (0, 60000]"},
		{`{"requests_per_minute": -5}`, "requests_per_minute: -5 is outside"},
		{`{"min_interval_ms": -1}`, "min_interval_ms: -1 is negative"},
		{`{"max_queue": -1}`, "max_queue: -1 is negative"},
		{`{"max_queue_wait_ms": -1}`, "max_queue_wait_ms: -1 is negative"},
		{`{"on_wait_timeout": "retry"}`, `on_wait_timeout: "retry" is neither "reject" nor "proceed"`},
		{`{"api_keys": [{"id": ""}]}`, `api_keys[0].id: "" is empty`},
		{`{"api_keys": [{"id": "a"}, {"id": "a"}]}`, `api_keys[1].id: "a" appears twice`},
		{`{"api_keys": [{"id": "a", "max_concurrent_requests": -2}]}`, "api_keys[0].max_concurrent_requests: -2 is negative"},
		{`{"models": {"glm-5.3": {"max_concurrent_requests": -1}}}`, `models["glm-5.3"].max_concurrent_requests: -1 is negative`},
		{`{"models": {"": {"max_concurrent_requests": 1}}}`, `models: "" is not a model's name (a request that names no model takes the provider's caps alone)`},
		{`{"models": {"glm-5.3": {"requests_per_minute": 70000}}}`, `models["glm-5.3"].requests_per_minute: 70000 is outside`},
		{`{"models": {"glm-5.3": {"min_interval_ms": -1}}}`, `models["glm-5.3"].min_interval_ms: -1 is negative`},
		// Past a day, and far past what a time.Duration holds: no overflow
		// into a negative wait or interval.
		{`{"min_interval_ms": 86400001}`, "min_interval_ms: 86400001 is over 86400000 (a day)"},
		{`{"max_queue_wait_ms": 9223372036854775807}`, "max_queue_wait_ms: 9223372036854775807 is over 86400000"},
		{`{"models": {"m": {"min_interval_ms": 9223372036854}}}`, `models["m"].min_interval_ms: 9223372036854 is over`},
	} {
		t.Run(tc.field, func(t *testing.T) {
			_, err := pacing.Parse([]byte(tc.json))
			assert.ErrorContains(t, err, "pacing: "+tc.field)
		})
	}
}

func TestIntervals(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    pacing.Config
		want time.Duration
	}{
		{"rpm 40 and min 1500 ms: 1500 ms", pacing.Config{RequestsPerMinute: 40, MinIntervalMS: 1500}, 1500 * time.Millisecond},
		{"rpm 60 and min 500 ms: the rpm wins", pacing.Config{RequestsPerMinute: 60, MinIntervalMS: 500}, time.Second},
		{"rpm 600 alone", pacing.Config{RequestsPerMinute: 600}, 100 * time.Millisecond},
		{"min alone", pacing.Config{MinIntervalMS: 250}, 250 * time.Millisecond},
		{"neither: unpaced", pacing.Config{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, tc.c.Interval()) })
	}
	c := pacing.Config{RequestsPerMinute: 40, Models: map[string]pacing.ModelConfig{
		"slow": {MinIntervalMS: 3000},
		"fast": {MinIntervalMS: 0},
	}}
	assert.Equal(t, 3*time.Second, c.ModelInterval("slow"), "a model override adds delay")
	assert.Zero(t, c.ModelInterval("fast"), "and a zero one adds none: the provider's 1.5 s still applies")
	assert.Zero(t, c.ModelInterval("other"))
	modelOnly := pacing.Config{Models: map[string]pacing.ModelConfig{"slow": {RequestsPerMinute: 6}}}
	assert.Zero(t, modelOnly.Interval(), "model-only pacing leaves other models unpaced")
	assert.Equal(t, 10*time.Second, modelOnly.ModelInterval("slow"))
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "zai.json")
	require.NoError(t, os.WriteFile(good, []byte(exampleConfig), 0o600))
	c, err := pacing.Load(good)
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, c.Interval())

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"min_interval_ms": -1}`), 0o600))
	_, err = pacing.Load(bad)
	assert.ErrorContains(t, err, "bad.json: pacing: min_interval_ms")

	_, err = pacing.Load(filepath.Join(dir, "missing.json"))
	assert.Error(t, err)
}

// A configuration is one JSON object and nothing after it: a second value,
// or a stray closing '}' or ']' (which json.Decoder.More does not see, so
// both read as the object alone before), is an error; space is not.
func TestParseRefusesDataAfterTheObject(t *testing.T) {
	for _, js := range []string{`{"max_concurrent_requests":1}}`, `{"max_concurrent_requests":1}]`, `{"max_concurrent_requests":1} x`, `{"max_concurrent_requests":1} {}`} {
		_, err := pacing.Parse([]byte(js))
		assert.ErrorContains(t, err, "pacing: data after the JSON object", js)
	}
	c, err := pacing.Parse([]byte("{\"max_concurrent_requests\":1}\n \t"))
	require.NoError(t, err)
	assert.Equal(t, 1, c.MaxConcurrentRequests)
}

// Each key of a pool learns its own cap under the provider's adaptive
// section, within the key's cap: a key whose cap is under adaptive.min is
// refused (the test of a cut took the floor, 4, over the key's cap of 2).
func TestKeyCapUnderAdaptiveMin(t *testing.T) {
	err := pacing.Config{Adaptive: &pacing.AdaptiveConfig{Min: 4}, APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 2}}}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "api_keys[0].max_concurrent_requests")
	assert.NoError(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Min: 2}, APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 2}}}.Validate())
}
