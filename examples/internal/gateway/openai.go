package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// maxBodyBytes bounds a model request's body, which the gateway reads
// whole to find its model.
const maxBodyBytes = 8 << 20

// errBodyTooLarge: a request body over maxBodyBytes.
var errBodyTooLarge = errors.New("request body too large")

// requestModel returns the "model" field of r's JSON body ("" when it has
// none) and the body, and puts back an equivalent body (and GetBody) for
// the proxy to send. A body over maxBytes fails with errBodyTooLarge.
func requestModel(r *http.Request, maxBytes int64) (string, []byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return "", nil, nil
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1)) // one byte more tells a body over the bound
	r.Body.Close()
	if err != nil {
		return "", nil, fmt.Errorf("reading the request body: %w", err)
	}
	if int64(len(buf)) > maxBytes {
		return "", nil, fmt.Errorf("%w: over %d bytes", errBodyTooLarge, maxBytes)
	}
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	r.ContentLength = int64(len(buf))
	model, err := pacing.ModelField(buf)
	if err != nil {
		return "", nil, errors.New(slots.ErrorMessage(err))
	}
	// A JSON object, whatever its Content-Type said (curl -d sends a
	// form's): it goes on as JSON, so that the upstream, and the
	// Transport's ask for a stream's usage, read it as the gateway did.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		r.Header.Set("Content-Type", "application/json")
	}
	// The fields the token estimate reads, as the upstream will read them.
	if k := pacing.FoldedKey(buf, "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options"); k != "" {
		return "", nil, fmt.Errorf("%q: a key that differs from a field's name only in case", k)
	}
	return model, buf, nil
}

// writeOpenAIError is a slots.ErrorWriter that answers in OpenAI's error
// shape, {"error":{"message":...,"type":...,"code":...}}, the type named
// after the status (slots.ErrorType).
func writeOpenAIError(w http.ResponseWriter, status int, message string) {
	writeOpenAIErrorWith(w, status, message, "", "")
}

// writeOpenAIErrorWith is writeOpenAIError with a refusal's cap and reason
// in the error, when not empty.
func writeOpenAIErrorWith(w http.ResponseWriter, status int, message, capName, reason string) {
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
			Cap     string  `json:"cap,omitempty"`
			Reason  string  `json:"reason,omitempty"`
		} `json:"error"`
	}
	body.Error.Message, body.Error.Type = message, slots.ErrorType(status)
	body.Error.Cap, body.Error.Reason = capName, reason
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // JSON, not sniffed: ">= 0" reads as written, not \u003e
	_ = enc.Encode(body)
}

// admissionAnswer is the status, Retry-After and message for an admission
// error: as slots.HTTPStatus maps it, but a cap of 0 (an org switched off)
// is a 403, which clients do not retry, and a fleet store that cannot be
// reached (on_unavailable "closed") is a 503. Only a refusal at the cap
// (slots.ErrLimitReached) says the cap is 0: a wait that timed out may
// carry no figures (one on the provider's caps was seen with limit 0).
func admissionAnswer(err error) (status int, retryAfter time.Duration, msg string) {
	var le *slots.LimitError
	var down *fleet.UnavailableError
	switch {
	case errors.As(err, &le) && le.Limit == 0 && errors.Is(err, slots.ErrLimitReached):
		return http.StatusForbidden, 0, "this organisation is disabled: its concurrency limit is 0"
	case errors.As(err, &down): // when to come back, as the fleet estimates it
		return http.StatusServiceUnavailable, down.RetryAfter(), "the shared concurrency caps cannot be checked now"
	}
	status, retryAfter = slots.HTTPStatus(err)
	if errors.As(err, &le) && retryAfter > 0 { // none for a request heavier than its cap
		retryAfter = max(le.RetryAfter, time.Millisecond) // to the millisecond: SetRetryAfter rounds it
	}
	if le != nil && strings.HasSuffix(le.Cap, "_per_minute") { // a budget, not a count in flight
		why := "it cannot start within its wait"
		switch {
		case errors.Is(err, slots.ErrWaitTimeout):
			why = "timed out waiting"
		case strings.HasPrefix(le.Cap, "tenant_"):
			why = "the org's budget, answered at once"
		}
		units := "tokens"
		if strings.HasSuffix(le.Cap, pacing.CapMaxRequestsPerMinute) {
			units = "requests"
		}
		return status, retryAfter, fmt.Sprintf("over the %s budget: %d of %d %s started in the last minute (%s)", le.Cap, le.InFlight, le.Limit, units, why)
	}
	return status, retryAfter, slots.ErrorMessage(err)
}

// CapHeader names, on a refusal, the cap that refused the request: "tenant"
// (the org's cap per model), or the provider's "provider", "model",
// "api_key", "pacing", "pause", "tokens" or "model_tokens" (see
// pacing.CapProvider, pacing.CapTokens), or a budget, as
// "tokens_per_minute", "model_output_tokens_per_minute",
// "api_key_tokens_per_minute", "max_requests_per_minute" (see
// pacing.CapTokensPerMinute, pacing.CapMaxRequestsPerMinute) or an org's,
// "tenant_tokens_per_minute".
const CapHeader = "X-Inflight-Cap"

// writeAdmissionError answers an admission error in OpenAI's shape, naming
// the cap that refused it and why in the CapHeader header and in the
// error's "cap" and "reason".
func writeAdmissionError(w http.ResponseWriter, capName string, err error) {
	status, retryAfter, msg := admissionAnswer(err)
	slots.SetRetryAfter(w.Header(), retryAfter)
	w.Header().Set(CapHeader, capName)
	writeOpenAIErrorWith(w, status, msg, capName, rejectReason(err))
}
