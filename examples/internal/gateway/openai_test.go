package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRequestModel(t *testing.T) {
	for _, tc := range []struct {
		name, body, model string
		max               int64
		tooLarge          bool
	}{
		{"a model", `{"model":"glm-5","stream":true}`, "glm-5", 1 << 10, false},
		{"no model", `{"messages":[]}`, "", 1 << 10, false},
		{"exactly at the bound", `{"model":"glm-5"}`, "glm-5", int64(len(`{"model":"glm-5"}`)), false},
		{"one byte over the bound", `{"model":"glm-5"}`, "", int64(len(`{"model":"glm-5"}`)) - 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(tc.body))
			model, _, err := requestModel(r, tc.max)
			if tc.tooLarge {
				assert.ErrorIs(t, err, errBodyTooLarge)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.model, model)
			rest, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Equal(t, tc.body, string(rest), "the body is put back whole")
			again, err := r.GetBody()
			require.NoError(t, err)
			rest, _ = io.ReadAll(again)
			assert.Equal(t, tc.body, string(rest), "and GetBody gives it again")
		})
	}
	t.Run("not JSON", func(t *testing.T) {
		_, _, err := requestModel(httptest.NewRequest(http.MethodPost, "/", strings.NewReader("model=glm-5")), 1<<10)
		assert.EqualError(t, err, "the request body is not a JSON object")
	})
}

func TestOpenAIErrorShape(t *testing.T) {
	for status, kind := range map[int]string{
		400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
		413: "invalid_request_error", 429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
	} {
		rec := httptest.NewRecorder()
		writeOpenAIError(rec, status, "why")
		assert.Equal(t, status, rec.Code)
		assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		var body struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
		assert.Equal(t, "why", body.Error.Message)
		assert.Equal(t, kind, body.Error.Type, "status %d", status)
	}
}
