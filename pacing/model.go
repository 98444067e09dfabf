package pacing

// The request's model: named by the caller (WithModelName, WithModel), or
// read from its JSON body's "model".

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/inflight-go/inflight/slots"
)

// modelOf returns req's model, and the request to send: req, or a copy
// with the body it read to find the model.
func (t *Transport) modelOf(req *http.Request) (string, *http.Request, error) {
	if m, ok := req.Context().Value(modelKey{}).(string); ok {
		return m, req, nil
	}
	if t.model != nil {
		return t.model(req), req, nil
	}
	if req.Body == nil || req.Body == http.NoBody {
		return "", req, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, MaxModelBody+1))
	req.Body.Close()
	if err != nil {
		return "", nil, fmt.Errorf("pacing: reading the request body: %w", err)
	}
	if len(buf) > MaxModelBody {
		return "", nil, &slots.BadRequestError{Status: http.StatusRequestEntityTooLarge,
			Reason: fmt.Sprintf("the request body is over %d bytes", MaxModelBody)}
	}
	model, err := ModelField(buf)
	if err != nil {
		return "", nil, err
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(buf))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	out.ContentLength = int64(len(buf))
	return model, out, nil
}

// MaxModelBody bounds the request body a Transport reads to find its
// model.
const MaxModelBody = 8 << 20

type modelKey struct{}

// WithModelName returns a context under which a Transport takes model as
// the request's model without reading its body: for a server that has
// read the body already (see ModelField).
func WithModelName(ctx context.Context, model string) context.Context {
	return context.WithValue(ctx, modelKey{}, model)
}

// ModelField returns the "model" of a JSON request body, as an
// OpenAI-compatible or Anthropic API puts it: "" if it has none (or it is
// null). A body that is not a JSON object, a model that is not a string,
// or a key that differs from "model" only in case (encoding/json would
// read it as the model, an upstream that reads keys as written would not:
// see FoldedKey) is a *slots.BadRequestError.
func ModelField(body []byte) (string, error) {
	var v struct {
		Model json.RawMessage `json:"model"`
	}
	if err := json.Unmarshal(body, &v); err != nil || string(bytes.TrimSpace(body)) == "null" { // which Unmarshal takes for no fields
		return "", &slots.BadRequestError{Reason: "the request body is not a JSON object"}
	}
	if k := FoldedKey(body, "model"); k != "" {
		return "", &slots.BadRequestError{Reason: fmt.Sprintf("%q: a key that differs from \"model\" only in case", k)}
	}
	var model *string
	if len(v.Model) > 0 {
		if err := json.Unmarshal(v.Model, &model); err != nil {
			return "", &slots.BadRequestError{Reason: "model: want a string"}
		}
	}
	if model == nil {
		return "", nil
	}
	return *model, nil
}

// FoldedKey returns the first key at the top level of the JSON object
// body that encoding/json matches to one of names (it folds case) but that
// is not that name as written; "" if there is none, or body is not valid
// JSON. A server that reads keys as written (as most outside Go do) sees
// such a key as another field: a request whose caps were read from it
// could go to the upstream as something else.
func FoldedKey(body []byte, names ...string) string {
	if !json.Valid(body) {
		return ""
	}
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case '"':
			j := i + 1
			for ; body[j] != '"'; j++ { // valid JSON: the string ends
				if body[j] == '\\' {
					j++
				}
			}
			k := j + 1
			for k < len(body) && (body[k] == ' ' || body[k] == '\t' || body[k] == '\n' || body[k] == '\r') {
				k++
			}
			if depth == 1 && k < len(body) && body[k] == ':' { // a key of the top level
				var key string
				if json.Unmarshal(body[i:j+1], &key) == nil {
					for _, name := range names {
						if key != name && strings.EqualFold(key, name) {
							return key
						}
					}
				}
			}
			i = j
		}
	}
	return ""
}
