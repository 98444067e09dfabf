// Package pacing admits one provider's requests under its policy: how many
// may be in flight to it (per provider, per model, per API key) and how far
// apart their starts must be (requests per minute, a minimum interval).
//
//	cfg, err := pacing.Load("provider.json") // names the field that is wrong
//	if err != nil {
//		return err
//	}
//	gate, err := pacing.NewGate("zai", cfg)
//	if err != nil {
//		return err
//	}
//	client := &http.Client{Transport: pacing.NewTransport(nil, gate,
//		pacing.WithCredential(pacing.BearerKeys(secrets)))}
//	resp, err := client.Do(req) // a refusal is a *slots.LimitError
//	if err != nil {
//		return err // nothing is held
//	}
//	defer resp.Body.Close() // the slot is held until the body is done
//
// The Transport waits for the Gate, puts the granted API key on the request,
// reports the answer to the Gate before the slot can be freed (a learned
// cap learns from it), and holds the slot for the whole streamed body. Gate.Acquire is the
// same admission for a caller that sends requests its own way.
//
// Config is the policy as a gateway's configuration file states it; a Gate
// applies it, and Reconfigure changes it live.
//
// A self-hosted server is limited by the tokens in flight (its KV cache) as
// much as by the requests: max_inflight_tokens caps them, per provider and
// per model, each request weighing what Gate.AcquireTokens (or a Transport
// under WithTokens) was told it costs. Budgets over time,
// tokens_per_minute (and its input and output parts) on the provider, a
// model or an API key, take each request's estimate when it starts and are
// corrected by the usage its answer reports (Gate.Settle; a Transport
// reads it with WatchUsage, asks a stream for it with WithStreamUsage, and
// tells clients what is left with WithRateLimitHeaders);
// max_requests_per_minute counts the requests themselves. A Budget stands
// alone, for a cap of the caller's, and never makes a request wait;
// Budgets keeps one per tenant while it is in use, and a Transport
// reserves, starts and settles them with WithBudgets.
//
// With an "adaptive" section the provider's cap is learned from the
// upstream's answers instead of configured: report each one before its
// slot can be freed, with gate.Report(grant, pacing.Classify(resp, nil)),
// or, in a proxy that must not hold an error answer up while its body is
// read, with pacing.ClassifyAsRead(resp, nil, func(v pacing.Verdict) {
// gate.Report(grant, v) }). Gate.Learned and OnLimitChange tell what was
// learned; package pacingtest scores settings against a simulated
// upstream. A Gate learns from its own process's counts; for one cap
// learned by a fleet of processes, from the fleet's counts, learn it on
// the fleet's Redis (registry/fleet's Learn) with the same AdaptiveConfig.
package pacing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/inflight-go/inflight/internal/badfield"
	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/slots"
)

// Defaults for the fields left out.
const (
	DefaultMaxQueue     = 256
	DefaultMaxQueueWait = 60 * time.Second
	// MaxRequestsPerMinute bounds requests_per_minute: 1000 a second.
	MaxRequestsPerMinute = 60_000
	// MaxMS bounds the fields in milliseconds (min_interval_ms,
	// max_queue_wait_ms, retest_ms): a day. More is surely a mistake, and
	// far more would overflow a time.Duration.
	MaxMS = upstream.MaxMS
)

// On-wait-timeout policies.
const (
	Reject  = "reject"  // a request queued past max_queue_wait_ms is rejected (the default)
	Proceed = "proceed" // it goes ahead without a slot (fail-open), counted and charged to the budgets, unless a budget holds it back
)

// Config is one provider's policy. Every field is optional, and a field left
// out (or zero) switches its control off, except the queue bounds:
// max_queue and max_queue_wait_ms left out or zero take DefaultMaxQueue and
// DefaultMaxQueueWait, and max_queue_per_flow left out bounds nothing,
// while 0 lets none of a flow's requests wait.
type Config struct {
	// MaxConcurrentRequests caps the provider's requests in flight.
	MaxConcurrentRequests int `json:"max_concurrent_requests,omitempty"`
	// MaxInflightTokens caps the tokens of the provider's requests in
	// flight, each weighing what Gate.AcquireN was told (a self-hosted
	// server's KV cache, say). 0: no such cap.
	MaxInflightTokens int `json:"max_inflight_tokens,omitempty"`
	// BudgetLimits are budgets over time: the tokens of the requests
	// started in any minute, as estimated at admission and corrected by
	// Gate.Settle (see Gate.AcquireTokens), and the requests themselves
	// (max_requests_per_minute: at most so many in any minute, where
	// requests_per_minute spaces them evenly); in the JSON, its fields
	// stand beside the others (tokens_per_minute...).
	BudgetLimits
	// RequestsPerMinute spaces starts evenly: 60 s / rpm apart, in (0, 60000].
	RequestsPerMinute int `json:"requests_per_minute,omitempty"`
	// MinIntervalMS is a floor on the spacing of starts, in milliseconds.
	MinIntervalMS int64 `json:"min_interval_ms,omitempty"`
	// MaxQueue bounds the requests waiting; the newest over it is rejected.
	// 0, like leaving it out, is DefaultMaxQueue (see QueueLimit); to let
	// none wait, set MaxQueuePerFlow to 0.
	MaxQueue int `json:"max_queue,omitempty"`
	// MaxQueueWaitMS bounds how long a request waits, in milliseconds: at
	// most MaxMS; 0, like leaving it out, is DefaultMaxQueueWait.
	MaxQueueWaitMS int64 `json:"max_queue_wait_ms,omitempty"`
	// OnWaitTimeout is Reject (the default) or Proceed.
	OnWaitTimeout string `json:"on_wait_timeout,omitempty"`
	// APIKeys is a pool of keys, each with its own cap; a request is given
	// the key with the most free capacity.
	APIKeys []KeyConfig `json:"api_keys,omitempty"`
	// Models adds per-model caps and spacing, by upstream model id (not
	// empty). A model cap tightens the provider cap; a model's spacing only
	// adds delay.
	Models map[string]ModelConfig `json:"models,omitempty"`
	// Shares guarantees priority classes ("interactive", "default",
	// "batch") a part of the provider cap; see slots.Share.
	Shares map[string]ShareConfig `json:"shares,omitempty"`
	// MaxQueuePerFlow bounds the requests of one flow (slots.WithFlow, for
	// example an org) waiting at once, as slots.WithMaxQueuePerFlow does:
	// 0 lets none of a flow's requests wait (a request that cannot start at
	// once is refused); left out (nil), only MaxQueue applies. Requests
	// without a flow form the flow "", so without flows it bounds the whole
	// queue.
	MaxQueuePerFlow *int `json:"max_queue_per_flow,omitempty"`
	// Adaptive, if present, learns the provider's cap from the upstream's
	// answers (see AdaptiveConfig); MaxConcurrentRequests is then its
	// ceiling and may be left out.
	Adaptive *AdaptiveConfig `json:"adaptive,omitempty"`
}

// ShareConfig is a class's guaranteed part of the provider cap: Min slots
// kept from other classes while it has waiters, Reserved slots kept even
// while it is idle.
type ShareConfig struct {
	Min      int `json:"min,omitempty"`
	Reserved int `json:"reserved,omitempty"`
}

// KeyConfig is one API key of a pool.
type KeyConfig struct {
	ID                    string `json:"id"`
	MaxConcurrentRequests int    `json:"max_concurrent_requests,omitempty"`
	// The key's budgets per minute (see Config.BudgetLimits): a request is
	// given a key whose budgets take its estimate, and its request.
	BudgetLimits
}

// ModelConfig is a model's own policy within its provider's.
type ModelConfig struct {
	MaxConcurrentRequests int `json:"max_concurrent_requests,omitempty"`
	// MaxInflightTokens caps the tokens of the model's requests in flight
	// (see Config.MaxInflightTokens).
	MaxInflightTokens int `json:"max_inflight_tokens,omitempty"`
	// The model's budgets per minute (see Config.BudgetLimits).
	BudgetLimits
	RequestsPerMinute int   `json:"requests_per_minute,omitempty"`
	MinIntervalMS     int64 `json:"min_interval_ms,omitempty"`
	// Adaptive, if present, learns the model's own cap (see Config.Adaptive).
	Adaptive *AdaptiveConfig `json:"adaptive,omitempty"`
}

// Parse reads a Config from JSON and validates it. Unknown fields are
// errors, so a misspelt limit does not silently switch a control off.
func Parse(data []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("pacing: %w", err)
	}
	if dec.Decode(new(json.RawMessage)) != io.EOF { // a stray '}' too, which More misses
		return Config{}, errors.New("pacing: data after the JSON object")
	}
	return c, c.Validate()
}

// Load reads and validates the Config in the file at path.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("pacing: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// bad is the error of a field out of range, named by its JSON path.
var bad = badfield.Error

// validPacing checks the pacing fields of a provider or a model, whose
// fields' paths start with prefix.
func validPacing(prefix string, maxConcurrent, rpm int, minMS int64) error {
	switch {
	case maxConcurrent < 0:
		return bad(prefix+"max_concurrent_requests", maxConcurrent, "is negative")
	case rpm < 0 || rpm > MaxRequestsPerMinute:
		return bad(prefix+"requests_per_minute", rpm, fmt.Sprintf("is outside (0, %d]", MaxRequestsPerMinute))
	case minMS < 0:
		return bad(prefix+"min_interval_ms", minMS, "is negative")
	case minMS > MaxMS:
		return bad(prefix+"min_interval_ms", minMS, fmt.Sprintf("is over %d (a day)", MaxMS))
	}
	return nil
}

// Validate reports the first field that is out of range, by its JSON path.
func (c Config) Validate() error {
	if err := validPacing("", c.MaxConcurrentRequests, c.RequestsPerMinute, c.MinIntervalMS); err != nil {
		return err
	}
	switch {
	case c.MaxQueue < 0:
		return bad("max_queue", c.MaxQueue, "is negative")
	case c.MaxQueueWaitMS < 0:
		return bad("max_queue_wait_ms", c.MaxQueueWaitMS, "is negative")
	case c.MaxQueueWaitMS > MaxMS:
		return bad("max_queue_wait_ms", c.MaxQueueWaitMS, fmt.Sprintf("is over %d (a day)", MaxMS))
	case c.OnWaitTimeout != "" && c.OnWaitTimeout != Reject && c.OnWaitTimeout != Proceed:
		return bad("on_wait_timeout", fmt.Sprintf("%q", c.OnWaitTimeout), `is neither "reject" nor "proceed"`)
	case c.MaxQueuePerFlow != nil && *c.MaxQueuePerFlow < 0:
		return bad("max_queue_per_flow", *c.MaxQueuePerFlow, "is negative")
	case c.MaxInflightTokens < 0:
		return bad("max_inflight_tokens", c.MaxInflightTokens, "is negative")
	}
	if err := upstream.CheckBudgets("", c.BudgetLimits); err != nil {
		return err
	}
	if c.Adaptive != nil {
		if err := c.Adaptive.Check("adaptive", c.MaxConcurrentRequests); err != nil {
			return err
		}
	}
	for class, sh := range c.Shares {
		field := fmt.Sprintf("shares[%q]", class)
		switch {
		case class != "interactive" && class != "default" && class != "batch":
			return bad(field, fmt.Sprintf("%q", class), `is not "interactive", "default" or "batch"`)
		case sh.Min < 0:
			return bad(field+".min", sh.Min, "is negative")
		case sh.Reserved < 0:
			return bad(field+".reserved", sh.Reserved, "is negative")
		}
	}
	seen := make(map[string]bool, len(c.APIKeys))
	for i, k := range c.APIKeys {
		field := fmt.Sprintf("api_keys[%d]", i)
		switch {
		case k.ID == "":
			return bad(field+".id", `""`, "is empty")
		case seen[k.ID]:
			return bad(field+".id", fmt.Sprintf("%q", k.ID), "appears twice")
		case k.MaxConcurrentRequests < 0:
			return bad(field+".max_concurrent_requests", k.MaxConcurrentRequests, "is negative")
		}
		if err := upstream.CheckBudgets(field+".", k.BudgetLimits); err != nil {
			return err
		}
		if c.Adaptive != nil { // each key learns its own cap, within its own
			if lo, hi := c.Adaptive.Bounds(k.MaxConcurrentRequests); lo > hi {
				return bad(field+".max_concurrent_requests", k.MaxConcurrentRequests, fmt.Sprintf("is under adaptive.min (%d), which each key's learned cap keeps", lo))
			}
		}
		seen[k.ID] = true
	}
	for name, m := range c.Models {
		if name == "" { // a fleet's caps would not hold it either
			return bad("models", `""`, "is not a model's name (a request that names no model takes the provider's caps alone)")
		}
		field := fmt.Sprintf("models[%q]", name)
		if err := validPacing(field+".", m.MaxConcurrentRequests, m.RequestsPerMinute, m.MinIntervalMS); err != nil {
			return err
		}
		if m.MaxInflightTokens < 0 {
			return bad(field+".max_inflight_tokens", m.MaxInflightTokens, "is negative")
		}
		if err := upstream.CheckBudgets(field+".", m.BudgetLimits); err != nil {
			return err
		}
		if m.Adaptive != nil {
			if err := m.Adaptive.Check(field+".adaptive", m.MaxConcurrentRequests); err != nil {
				return err
			}
		}
	}
	return nil
}

// interval is the spacing that rpm and a minimum interval ask for together:
// the larger of 60 s / rpm and the minimum; 0 when neither is set.
func interval(rpm int, minMS int64) time.Duration {
	d := time.Duration(minMS) * time.Millisecond
	if rpm > 0 {
		d = max(d, time.Minute/time.Duration(rpm))
	}
	return d
}

// Interval is the provider's spacing between granted starts.
func (c Config) Interval() time.Duration { return interval(c.RequestsPerMinute, c.MinIntervalMS) }

// ModelInterval is the spacing between granted starts of model's requests:
// the model's own spacing, or 0 when it has none. A request for the model
// must also respect the provider's Interval, so a model can only add delay.
func (c Config) ModelInterval(model string) time.Duration {
	m, ok := c.Models[model]
	if !ok {
		return 0
	}
	return interval(m.RequestsPerMinute, m.MinIntervalMS)
}

// QueueLimit is MaxQueue, or DefaultMaxQueue when it is left out.
func (c Config) QueueLimit() int {
	if c.MaxQueue == 0 {
		return DefaultMaxQueue
	}
	return c.MaxQueue
}

// QueueWait is MaxQueueWaitMS, or DefaultMaxQueueWait when it is left out.
func (c Config) QueueWait() time.Duration {
	if c.MaxQueueWaitMS == 0 {
		return DefaultMaxQueueWait
	}
	return time.Duration(c.MaxQueueWaitMS) * time.Millisecond
}

// FailOpen reports whether a request queued past QueueWait proceeds.
func (c Config) FailOpen() bool { return c.OnWaitTimeout == Proceed }

// shares returns the provider lane's shares, or nil when none is set.
func (c Config) shares() *core.Shares {
	var sh *core.Shares
	for class, s := range c.Shares {
		if s == (ShareConfig{}) {
			continue
		}
		if sh == nil {
			sh = new(core.Shares)
		}
		p, _ := slots.ParsePriority(class) // checked by Validate
		cl := core.ClassOf(int8(p))
		sh.Min[cl], sh.Reserved[cl] = s.Min, s.Reserved
	}
	return sh
}
