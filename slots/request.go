package slots

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
)

// ErrBodyTooLarge: RequestModel met a body over its size bound.
var ErrBodyTooLarge = errors.New("slots: request body too large")

// RequestModel returns the "model" field of r's JSON body ("" when it has
// none), so an admit function can cap per model. It leaves the body readable
// from the start for whoever handles or sends r next: it reads the body into
// memory, at most maxBytes of it, and puts back an equivalent body (and
// GetBody, for redirects and retries).
//
// Call it where r belongs to you, as on a server's incoming request before
// proxying it; a Transport's admit function must not replace the body of a
// request it is handed (a RoundTripper does not modify its request), so pass
// the model on in the context instead. A body over maxBytes fails with
// ErrBodyTooLarge and is left whole as well; a body that is not JSON fails
// with the decoding error. math.MaxInt64 bounds nothing; a negative
// maxBytes is taken as 0.
func RequestModel(r *http.Request, maxBytes int64) (string, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return "", nil
	}
	maxBytes = max(maxBytes, 0)
	limit := maxBytes // one byte over the bound tells a body over it
	if limit < math.MaxInt64 {
		limit++
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, limit))
	if err != nil {
		// What was read is put back in front of the rest.
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		return "", fmt.Errorf("slots: reading the request body: %w", err)
	}
	if int64(len(buf)) > maxBytes {
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		return "", fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, maxBytes)
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	r.ContentLength = int64(len(buf))
	var v struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(buf, &v); err != nil {
		return "", fmt.Errorf("slots: the request body is not JSON with a model: %w", err)
	}
	return v.Model, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}
