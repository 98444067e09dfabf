package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// Config is the gateway's configuration file.
type Config struct {
	Listen   string        `json:"listen"`
	Upstream string        `json:"upstream"`
	Orgs     OrgsConfig    `json:"orgs"`
	Provider pacing.Config `json:"provider"`
	Fleet    *FleetConfig  `json:"fleet,omitempty"`
}

// FleetConfig makes the org caps and the provider and model caps hold
// across every gateway process pointed at the same Redis (package
// registry/fleet). Pacing and API-key caps stay per process.
type FleetConfig struct {
	RedisURL      string `json:"redis_url"`                // redis://host:port/db
	LeaseTTLMS    int64  `json:"lease_ttl_ms,omitempty"`   // default 30000
	OnUnavailable string `json:"on_unavailable,omitempty"` // "local" (default), "closed" or "open"
}

// OrgsConfig caps each organisation's requests in flight per model, and
// says how its requests queue for the provider: its priority class when a
// request has no X-Priority header, and its weight among the orgs that wait.
type OrgsConfig struct {
	DefaultLimit int               `json:"default_limit"`
	Limits       map[string]int    `json:"limits"`
	Priorities   map[string]string `json:"priorities"` // org -> "interactive", "default" or "batch"
	Weights      map[string]int    `json:"weights"`    // org -> turns taken while orgs wait (default 1)
}

// LoadConfig reads and checks the file at path; errors name the bad field.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseConfig(data)
}

// ParseConfig reads and checks a configuration; errors name the bad field.
func ParseConfig(data []byte) (Config, error) {
	c := Config{Listen: "127.0.0.1:8080", Orgs: OrgsConfig{DefaultLimit: 64}}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if c.Upstream == "" {
		return Config{}, errors.New("config: upstream: missing")
	}
	if u, err := url.Parse(c.Upstream); err != nil || u.Scheme == "" || u.Host == "" {
		return Config{}, fmt.Errorf("config: upstream: %q is not an absolute URL", c.Upstream)
	}
	if c.Orgs.DefaultLimit < 0 {
		return Config{}, fmt.Errorf("config: orgs.default_limit: %d is negative", c.Orgs.DefaultLimit)
	}
	for org, n := range c.Orgs.Limits {
		if n < 0 {
			return Config{}, fmt.Errorf("config: orgs.limits[%q]: %d is negative", org, n)
		}
	}
	for org, p := range c.Orgs.Priorities {
		if _, err := slots.ParsePriority(p); err != nil || p == "" {
			return Config{}, fmt.Errorf("config: orgs.priorities[%q]: %q is not interactive, default or batch", org, p)
		}
	}
	for org, w := range c.Orgs.Weights {
		if w < 1 {
			return Config{}, fmt.Errorf("config: orgs.weights[%q]: %d is below 1", org, w)
		}
	}
	if f := c.Fleet; f != nil {
		if _, err := redis.ParseURL(f.RedisURL); err != nil {
			return Config{}, fmt.Errorf("config: fleet.redis_url: %w", err)
		}
		if f.LeaseTTLMS != 0 && f.LeaseTTLMS < 30 {
			return Config{}, fmt.Errorf("config: fleet.lease_ttl_ms: %d is under 30", f.LeaseTTLMS)
		}
		if _, err := fleet.ParseUnavailable(f.OnUnavailable); err != nil {
			return Config{}, fmt.Errorf("config: fleet.on_unavailable: %w", err)
		}
	}
	if err := c.Provider.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: provider: %w", err)
	}
	return c, nil
}
