package pacing

// The fleet's caps, as a Transport takes them: on requests (WithFleet)
// and on tokens in flight (WithFleetTokens).

import (
	"context"
	"errors"
	"strings"

	"github.com/inflight-go/inflight/slots"
)

// FleetCaps is the fleet-wide side of a provider's caps: a
// fleet.Registry[string] whose keys are "provider" and "model:" followed by
// the model's name. A request takes the provider's key and, when its
// limit is not slots.Unlimited, the model's, before it waits for the
// Gate; every answer is reported to it as to the Gate. In the fleet's
// queue, flows take turns in each key's own units: requests on these
// keys, tokens on those of WithFleetTokens (the Gate's own queue weighs a
// request by the cap that binds, see AcquireN). A refusal there has its
// LimitError's Cap set to CapProvider or CapModel, as the Gate's would.
type FleetCaps interface {
	AcquireAll(ctx context.Context, keys ...string) (*slots.Slot, error)
	Report(s *slots.Slot, v Verdict)
	Limit(key string) int
}

// fleetCaps takes the fleet's caps of a request for model: the
// provider's, and the model's when its limit is not slots.Unlimited.
func (t *Transport) fleetCaps(ctx context.Context, model string) (*slots.Slot, error) {
	keys := []string{"provider"}
	if mk := "model:" + model; model != "" && t.caps.Limit(mk) != slots.Unlimited {
		keys = append(keys, mk)
	}
	s, err := t.caps.AcquireAll(ctx, keys...)
	return s, nameFleetCap(err, CapProvider, "model:", CapModel)
}

// FleetTokenCaps is the fleet-wide side of a provider's caps on tokens in
// flight, as Config.MaxInflightTokens and ModelConfig.MaxInflightTokens
// cap them in one process: a fleet.Registry[string] (made with the default
// limit slots.Unlimited) whose keys are FleetTokens and FleetModelTokens
// followed by the model's name, each limited in tokens. After the
// FleetCaps, a request takes those of the two whose limit is not
// slots.Unlimited, weighing what it weighs in the Gate (WithTokens; one
// token without), as one lease of that many units; then it waits for the
// Gate. A refusal there has its LimitError's Cap set to CapTokens or
// CapModelTokens.
type FleetTokenCaps interface {
	AcquireAllN(ctx context.Context, n int, keys ...string) (*slots.Slot, error)
	Limit(key string) int
}

// The keys of a fleet's token caps (see FleetTokenCaps).
const (
	FleetTokens      = "tokens"
	FleetModelTokens = "model_tokens:" // followed by the model's name
)

// fleetTokens takes the fleet's token caps of a request for model that
// weighs n tokens: nil, with no error, when neither has a limit.
func (t *Transport) fleetTokens(ctx context.Context, model string, n int) (*slots.Slot, error) {
	keys := make([]string, 0, 2)
	if t.tokenCaps.Limit(FleetTokens) != slots.Unlimited {
		keys = append(keys, FleetTokens)
	}
	if mk := FleetModelTokens + model; model != "" && t.tokenCaps.Limit(mk) != slots.Unlimited {
		keys = append(keys, mk)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	s, err := t.tokenCaps.AcquireAllN(ctx, n, keys...)
	return s, nameFleetCap(err, CapTokens, FleetModelTokens, CapModelTokens)
}

// nameFleetCap names the Cap of the fleet's refusal err as the Gate names
// its own: modelCap when its key starts with modelPrefix, whole otherwise.
// It names a copy: the fleet handed its refusal to its Observer as well,
// which may still read it on another goroutine.
func nameFleetCap(err error, whole, modelPrefix, modelCap string) error {
	var le *slots.LimitError
	if !errors.As(err, &le) || le.Cap != "" {
		return err
	}
	named := *le
	named.Cap = whole
	if strings.HasPrefix(le.Key, modelPrefix) {
		named.Cap = modelCap
	}
	if err == error(le) {
		return &named
	}
	return namedRefusal{err: err, named: &named}
}

// namedRefusal is a refusal wrapped in err whose LimitError was named: its
// errors.As finds the named copy first.
type namedRefusal struct {
	err   error
	named *slots.LimitError
}

func (e namedRefusal) Error() string   { return e.err.Error() }
func (e namedRefusal) Unwrap() []error { return []error{e.named, e.err} }

// WithFleetTokens makes requests take the fleet's caps on tokens in flight
// too (see FleetTokenCaps). It may be the Registry given to WithFleet.
func WithFleetTokens(caps FleetTokenCaps) TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.tokenCaps = caps })
}
