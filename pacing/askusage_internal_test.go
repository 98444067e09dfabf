package pacing

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stream is asked for its usage only when the client did not ask,
// keeping the client's other stream options; a body that is no stream, or
// not JSON, is left as it is.
func TestAskUsage(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"stream":true,"model":"m"}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"x":1}}`, `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":true}}`, ""},
		{`{"stream":false}`, ""},
		{`{"stream":true,"stream_options":7}`, ""},
		{`not json`, ""},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
		out, asked, err := askUsageOf(r)
		require.NoError(t, err)
		assert.Equal(t, tc.want != "", asked, tc.body)
		got, err := io.ReadAll(out.Body)
		require.NoError(t, err)
		assert.Equal(t, int64(len(got)), out.ContentLength)
		if asked {
			assert.JSONEq(t, tc.want, string(got))
		} else {
			assert.Equal(t, tc.body, string(got), "sent as it came")
		}
	}
	// Larger than it reads: sent as it came, whole.
	huge := `{"stream":true,"x":"` + strings.Repeat("a", MaxModelBody) + `"}`
	out, asked, err := askUsageOf(httptest.NewRequest(http.MethodPost, "/", strings.NewReader(huge)))
	require.NoError(t, err)
	assert.False(t, asked)
	got, err := io.ReadAll(out.Body)
	require.NoError(t, err)
	assert.Equal(t, huge, string(got))
	require.NoError(t, out.Body.Close())

	// Not JSON: not read at all.
	form := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"stream":true}`))
	form.Header.Set("Content-Type", "multipart/form-data; boundary=x")
	out, asked, err = askUsageOf(form)
	require.NoError(t, err)
	assert.False(t, asked)
	assert.Same(t, form, out)
	js := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"stream":true}`))
	js.Header.Set("Content-Type", "application/json; charset=utf-8")
	_, asked, err = askUsageOf(js)
	require.NoError(t, err)
	assert.True(t, asked, "JSON with its charset")
}

// askUsage on bodies a client may send: spacing, a string "true",
// duplicate keys (the last wins), include_usage false or null, options
// that are no object, characters JSON escapes.
func TestAskUsageBodies(t *testing.T) {
	for _, tc := range []struct {
		body string
		ask  bool
	}{
		{`{"stream" : true , "model":"m"}`, true},
		{`{"stream":"true"}`, false},
		{`{"stream":false,"stream":true}`, true},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, true},
		{`{"stream":true,"stream_options":{"include_usage":null}}`, true},
		{`{"stream":true,"stream_options":[]}`, false},
		{`{"stream":true,"x":"<a&b>"}`, true},
	} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(tc.body))
		out, got, err := askUsageOf(r)
		require.NoError(t, err)
		b, _ := io.ReadAll(out.Body)
		assert.Equal(t, tc.ask, got, tc.body)
		assert.EqualValues(t, len(b), out.ContentLength)
		gb, _ := out.GetBody()
		b2, _ := io.ReadAll(gb)
		assert.Equal(t, b, b2)
	}
}
