package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"

	"github.com/inflight-go/inflight/pacing"
)

// Config is the gateway's configuration file.
type Config struct {
	Listen   string        `json:"listen"`
	Upstream string        `json:"upstream"`
	Orgs     OrgsConfig    `json:"orgs"`
	Provider pacing.Config `json:"provider"`
}

// OrgsConfig caps each organisation's requests in flight per model.
type OrgsConfig struct {
	DefaultLimit int            `json:"default_limit"`
	Limits       map[string]int `json:"limits"`
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
	if err := c.Provider.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: provider: %w", err)
	}
	return c, nil
}
