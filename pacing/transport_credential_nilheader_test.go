package pacing_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A request built by hand without a Header (RoundTrip called directly,
// not through an http.Client, which makes one) is sent with its key's
// credential: the credential function gets a Header it can set. It got
// the nil copy of the request's, and BearerKeys panicked out of RoundTrip
// on it (assignment to entry in nil map).
func TestCredentialOnARequestWithoutHeader(t *testing.T) {
	var got string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Get("Authorization")
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})
	gate := tGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k1"}}})
	rt := pacing.NewTransport(base, gate, pacing.WithCredential(pacing.BearerKeys(map[string]string{"k1": "sk-secret"})))
	req := post(t, t.Context(), `{"model":"m"}`)
	req.Header = nil
	var resp *http.Response
	var err error
	require.NotPanics(t, func() { resp, err = rt.RoundTrip(req) })
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "Bearer sk-secret", got)
	assert.Nil(t, req.Header, "the caller's request is not modified")
	assert.Zero(t, gate.Status().InFlight)
}
