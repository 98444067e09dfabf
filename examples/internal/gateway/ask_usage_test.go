package gateway

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

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
		got := askUsage(r, []byte(tc.body))
		b, _ := io.ReadAll(r.Body)
		assert.Equal(t, tc.ask, got, tc.body)
		if got {
			assert.EqualValues(t, len(b), r.ContentLength)
			gb, _ := r.GetBody()
			b2, _ := io.ReadAll(gb)
			assert.Equal(t, b, b2)
		}
	}
}
