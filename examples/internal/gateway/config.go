package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"math"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// Config is the gateway's configuration file.
type Config struct {
	Listen string `json:"listen"`
	// Upstream is the provider's http or https URL; a path in it goes
	// before each request's own ("https://api.openai.com", not ".../v1",
	// for clients that send /v1/chat/completions).
	Upstream string     `json:"upstream"`
	Orgs     OrgsConfig `json:"orgs"`
	// Provider is the provider's policy (package pacing). With an
	// "adaptive" section its concurrency cap is learned from the
	// upstream's answers, and max_concurrent_requests may be left out (if
	// set, it is the ceiling); a model's own "adaptive" section learns that
	// model's cap. With a fleet, the provider's and the models' learned
	// caps are shared by every gateway on its Redis (a key pool's are not:
	// a fleet refuses a key pool that learns).
	Provider pacing.Config `json:"provider"`
	Fleet    *FleetConfig  `json:"fleet,omitempty"`
	// CutLingerMS keeps the provider's slots of a stream that was cut (the
	// client went away, or the upstream exchange failed midway) for this
	// many milliseconds after the gateway has closed its upstream
	// connection: the upstream counts the request until it notices the
	// close, and a request let in before that would meet its 429 at a cap
	// equal to the upstream's own limit. 0 means DefaultCutLingerMS; a
	// negative value turns the linger off; at most MaxCutLingerMS. A stream
	// read to its end frees its slots at once.
	CutLingerMS int64 `json:"cut_linger_ms,omitempty"`
	// ShutdownTimeoutMS bounds the drain on SIGTERM or SIGINT: requests
	// and streams in flight get this long to finish before they are cut.
	// 0 means DefaultShutdownTimeoutMS.
	ShutdownTimeoutMS int64 `json:"shutdown_timeout_ms,omitempty"`
	// Admin serves the admin and debug endpoints, behind a bearer token;
	// without it they are not served at all.
	Admin *AdminConfig `json:"admin,omitempty"`
	// APIKeyEnv names, for each id of provider.api_keys, the environment
	// variable holding that key's secret, sent upstream as "Authorization:
	// Bearer <secret>". An id is a name, safe to log and to export as a
	// label; the secret stays out of the file, the logs and the metrics. A
	// key without an entry sends no Authorization header.
	APIKeyEnv map[string]string `json:"api_key_env,omitempty"`
	// Metrics adds series beyond one per cap.
	Metrics *MetricsConfig `json:"metrics,omitempty"`
	// Telemetry sends traces and metrics over OTLP as well; off without it.
	Telemetry *TelemetryConfig `json:"telemetry,omitempty"`
	// Tokens says how requests' tokens are estimated for the provider's
	// max_inflight_tokens (in provider or a model); unused without those.
	Tokens *TokensConfig `json:"tokens,omitempty"`

	// apiKeys holds the secrets read from APIKeyEnv, by key id. Unexported,
	// so that a marshalled config never carries them.
	apiKeys map[string]string
}

// MetricsConfig adds series whose number the operator chooses.
type MetricsConfig struct {
	// PerOrg counts refusals by org as well (inflight_org_rejected_total,
	// labelled org, cap and reason): one series per org that was ever
	// refused, which clients choose when the org comes from a header.
	PerOrg bool `json:"per_org,omitempty"`
}

// DefaultShutdownTimeoutMS is the drain's bound when the config does not
// set one: a long streamed turn takes minutes, most take seconds.
const DefaultShutdownTimeoutMS = 30_000

// ShutdownTimeout returns how long the drain may take.
func (c Config) ShutdownTimeout() time.Duration {
	if c.ShutdownTimeoutMS == 0 {
		return DefaultShutdownTimeoutMS * time.Millisecond
	}
	return millis(c.ShutdownTimeoutMS)
}

// AdminConfig guards the admin endpoints (PATCH and DELETE
// /admin/orgs/{org}/concurrent-limit) and the debug ones (/debug/slots,
// /debug/provider): each request needs "Authorization: Bearer <token>".
// The token is Token, or the value of the environment variable TokenEnv
// (which keeps it out of the file); exactly one of them is set.
type AdminConfig struct {
	Token    string `json:"token,omitempty"`
	TokenEnv string `json:"token_env,omitempty"`
	// Listen serves the admin and debug endpoints on an address of their
	// own (say, one that only the operators' network reaches) instead of
	// beside the model API.
	Listen string `json:"listen,omitempty"`
}

// minTokenBytes keeps a guessable token out of the config.
const minTokenBytes = 16

// token returns the admin token, read from the environment for TokenEnv.
func (a *AdminConfig) token() (string, error) {
	switch {
	case a.Token != "" && a.TokenEnv != "":
		return "", errors.New("token: set token or token_env, not both")
	case a.TokenEnv != "":
		t, err := secretFromEnv(a.TokenEnv)
		if err != nil {
			return "", fmt.Errorf("token_env: %w", err)
		}
		if len(t) < minTokenBytes {
			return "", fmt.Errorf("token_env: the token in %s is under %d bytes", a.TokenEnv, minTokenBytes)
		}
		return t, nil
	case a.Token != "":
		if err := checkSecret(a.Token); err != nil {
			return "", fmt.Errorf("token: %w", err)
		}
		if len(a.Token) < minTokenBytes {
			return "", fmt.Errorf("token: under %d bytes", minTokenBytes)
		}
		return a.Token, nil
	}
	return "", errors.New("token or token_env: missing")
}

// secretFromEnv returns the value of the environment variable name, without
// the whitespace around it (a file read into a variable ends in a newline,
// which would never match); errors name the variable, never its value.
func secretFromEnv(name string) (string, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return "", fmt.Errorf("the environment variable %s is not set", name)
	}
	if err := checkSecret(v); err != nil {
		return "", fmt.Errorf("the value of %s: %w", name, err)
	}
	return v, nil
}

// checkSecret refuses a secret that cannot travel as a bearer credential:
// one with whitespace or control characters in it.
func checkSecret(s string) error {
	if strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return errors.New("contains whitespace or control characters")
	}
	return nil
}

// Redacted returns the config as it may be logged: the admin token and the
// passwords in the upstream and Redis URLs replaced. The API keys' secrets
// are never in it.
func (c Config) Redacted() Config {
	c.Upstream = redactURL(c.Upstream)
	if c.Admin != nil {
		a := *c.Admin
		if a.Token != "" {
			a.Token = "[redacted]"
		}
		c.Admin = &a
	}
	if c.Fleet != nil {
		f := *c.Fleet
		f.RedisURL = redactURL(f.RedisURL)
		f.PostgresURL = redactURL(f.PostgresURL)
		f.PostgresListenURL = redactURL(f.PostgresListenURL)
		c.Fleet = &f
	}
	return c
}

// redactURL returns raw with its password replaced, for a log line.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "[unparsable]"
	case u.Scheme == "":
		// PostgreSQL's keyword/value form: host=db password=...
		return kvPassword.ReplaceAllString(raw, "${1}xxxxx")
	}
	return u.Redacted()
}

// kvPassword is a password in a keyword/value connection string, quoted
// or not.
var kvPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// MaxCutLingerMS bounds cut_linger_ms: an upstream that has not noticed a
// cut within a minute is not noticing it, and each cut would hold a slot
// that long.
const MaxCutLingerMS = 60_000

// DefaultCutLingerMS is the linger after a cut when the config does not
// set one: a round trip to a provider and the time its server takes to see
// a closed connection (a streaming server sees it at its next token) are
// well within it, and a slot held that much longer is a small part of a
// streamed turn, which takes seconds.
const DefaultCutLingerMS = 250

// cutLinger returns the linger after a cut.
func (c Config) cutLinger() time.Duration {
	switch {
	case c.CutLingerMS < 0:
		return 0
	case c.CutLingerMS == 0:
		return DefaultCutLingerMS * time.Millisecond
	}
	return millis(c.CutLingerMS)
}

// millis converts a count of milliseconds from the config, saturating
// where time.Duration would overflow.
func millis(ms int64) time.Duration {
	if ms > int64(math.MaxInt64/time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// FleetConfig makes the org caps and the provider and model caps hold
// across every gateway process pointed at the same Redis or the same
// PostgreSQL database (packages registry/fleet and registry/fleet/pgstore):
// one of RedisURL and PostgresURL. Pacing and API-key caps stay per
// process.
type FleetConfig struct {
	RedisURL    string `json:"redis_url,omitempty"`    // redis://host:port/db
	PostgresURL string `json:"postgres_url,omitempty"` // postgres://user@host:port/db
	// PostgresListenURL is the database itself, for the one connection
	// that listens for wake-ups, when PostgresURL goes through PgBouncer
	// in transaction mode (LISTEN is session state). With it, the pool's
	// statements go unprepared (pgx's default_query_exec_mode=exec)
	// unless PostgresURL says otherwise.
	PostgresListenURL string `json:"postgres_listen_url,omitempty"`
	LeaseTTLMS        int64  `json:"lease_ttl_ms,omitempty"`   // default 30000, from 30 to a day
	OnUnavailable     string `json:"on_unavailable,omitempty"` // "local" (default), "closed" or "open"
	// TimeoutMS is how long a call to the store (a lease's, a budget's)
	// may take before it counts as failed; three in a row open the
	// breaker (see on_unavailable). Default 500 on Redis, 2000 on
	// PostgreSQL, whose calls wait for a pooled connection and a
	// transaction: under load they pass 500 ms now and then, and a breaker
	// that opens for that sends every gateway to its own caps at once. The
	// cost of a longer one: while the store hangs, a request waits up to
	// twice it for its org cap before the breaker opens, and Close up to
	// three times it per fleet. At most a third of the lease TTL (the
	// default is cut to that).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// LearnedFormat is the format of the learned caps' state the gateway
	// writes in the store: 2 (0: the default), or 1 through a rolling
	// deploy from, or before a rollback to, a release that reads only
	// format 1 (fleet.WithLearnedFormat).
	LearnedFormat int `json:"learned_format,omitempty"`
}

// leaseTTL returns the fleet's lease TTL (see LeaseTTLMS).
func (f *FleetConfig) leaseTTL() time.Duration {
	if f.LeaseTTLMS > 0 {
		return millis(f.LeaseTTLMS)
	}
	return fleet.DefaultLeaseTTL
}

// timeout returns the fleet's call timeout (see TimeoutMS).
func (f *FleetConfig) timeout() time.Duration {
	switch {
	case f.TimeoutMS > 0:
		return millis(f.TimeoutMS)
	case f.PostgresURL != "":
		return min(2*time.Second, f.leaseTTL()/3)
	}
	return min(500*time.Millisecond, f.leaseTTL()/3)
}

// OrgsConfig caps each organisation's requests in flight per model, and
// says how its requests queue for the provider: its priority class when a
// request has no X-Priority header, and its weight among the orgs that wait.
type OrgsConfig struct {
	DefaultLimit int               `json:"default_limit"`
	Limits       map[string]int    `json:"limits"`
	Priorities   map[string]string `json:"priorities"` // org -> "interactive", "default" or "batch"
	Weights      map[string]int    `json:"weights"`    // org -> turns taken while orgs wait (default 1)
	// Budget is each org's budget per minute (of tokens, of requests),
	// and Budgets an org's own; a request over its org's budget is
	// answered 429 at once, with a Retry-After from the refill. Unset:
	// none.
	Budget  *pacing.BudgetLimits           `json:"budget,omitempty"`
	Budgets map[string]pacing.BudgetLimits `json:"budgets,omitempty"`
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
	if dec.Decode(new(json.RawMessage)) != io.EOF {
		return Config{}, errors.New("config: data after the JSON object")
	}
	if c.Upstream == "" {
		return Config{}, errors.New("config: upstream: missing")
	}
	// The proxy's Transport speaks HTTP alone: another scheme would load,
	// then answer every request 502.
	if u, err := url.Parse(c.Upstream); err != nil || u.Host == "" || !strings.EqualFold(u.Scheme, "http") && !strings.EqualFold(u.Scheme, "https") {
		return Config{}, fmt.Errorf("config: upstream: %q is not an absolute http or https URL", redactURL(c.Upstream))
	}
	// net.Listen takes "" as every interface on a random port: left out,
	// listen is the default.
	if c.Listen == "" {
		return Config{}, errors.New("config: listen: empty (leave it out for 127.0.0.1:8080)")
	}
	if c.CutLingerMS > MaxCutLingerMS {
		return Config{}, fmt.Errorf("config: cut_linger_ms: %d is over %d", c.CutLingerMS, MaxCutLingerMS)
	}
	if c.ShutdownTimeoutMS < 0 || c.ShutdownTimeoutMS > pacing.MaxMS {
		return Config{}, fmt.Errorf("config: shutdown_timeout_ms: %d is not between 0 and %d", c.ShutdownTimeoutMS, pacing.MaxMS)
	}
	if c.Admin != nil {
		if _, err := c.Admin.token(); err != nil {
			return Config{}, fmt.Errorf("config: admin.%w", err)
		}
	}
	if c.Telemetry != nil {
		if err := c.Telemetry.check(); err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
	}
	if c.Tokens != nil {
		if err := c.Tokens.check(); err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
	}
	if c.Orgs.Budget != nil {
		if _, err := pacing.NewBudget(*c.Orgs.Budget); err != nil {
			return Config{}, fmt.Errorf("config: orgs.budget: %w", err)
		}
	}
	for org, l := range c.Orgs.Budgets {
		if _, err := pacing.NewBudget(l); err != nil {
			return Config{}, fmt.Errorf("config: orgs.budgets[%q]: %w", org, err)
		}
	}
	if err := c.checkNames(); err != nil {
		return Config{}, err
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
		if w < 1 || w > 1<<20 {
			return Config{}, fmt.Errorf("config: orgs.weights[%q]: %d is not from 1 to 1048576 (slots.WithFlowWeight)", org, w)
		}
	}
	if f := c.Fleet; f != nil {
		// Not wrapped: the parsers' errors quote the URL, password and
		// all.
		switch {
		case (f.RedisURL == "") == (f.PostgresURL == ""):
			return Config{}, errors.New("config: fleet: one of redis_url and postgres_url")
		case f.PostgresURL != "":
			if _, err := pgxpool.ParseConfig(f.PostgresURL); err != nil {
				return Config{}, errors.New("config: fleet.postgres_url: not a valid PostgreSQL URL (postgres://[user:password@]host:port/db)")
			}
			if _, err := pgxpool.ParseConfig(f.PostgresListenURL); f.PostgresListenURL != "" && err != nil {
				return Config{}, errors.New("config: fleet.postgres_listen_url: not a valid PostgreSQL URL (postgres://[user:password@]host:port/db)")
			}
		case f.PostgresListenURL != "":
			return Config{}, errors.New("config: fleet.postgres_listen_url: only with postgres_url")
		default:
			if _, err := redis.ParseURL(f.RedisURL); err != nil {
				return Config{}, errors.New("config: fleet.redis_url: not a valid redis URL (redis://[user:password@]host:port/db)")
			}
		}
		if f.TimeoutMS < 0 || f.TimeoutMS > 0 && millis(f.TimeoutMS) > f.leaseTTL()/3 {
			return Config{}, fmt.Errorf("config: fleet.timeout_ms: %d is not within 1 and a third of the lease TTL (%d)", f.TimeoutMS, f.leaseTTL().Milliseconds()/3)
		}
		if f.LeaseTTLMS != 0 && (f.LeaseTTLMS < 30 || millis(f.LeaseTTLMS) > fleet.MaxLeaseTTL) {
			return Config{}, fmt.Errorf("config: fleet.lease_ttl_ms: %d is not from 30 to %d (a day)", f.LeaseTTLMS, fleet.MaxLeaseTTL.Milliseconds())
		}
		if _, err := fleet.ParseUnavailable(f.OnUnavailable); err != nil {
			return Config{}, fmt.Errorf("config: fleet.on_unavailable: %w", err)
		}
		if f.LearnedFormat != 0 && f.LearnedFormat != 1 && f.LearnedFormat != 2 {
			return Config{}, fmt.Errorf("config: fleet.learned_format: %d is not 1 or 2", f.LearnedFormat)
		}
		// A key pool's caps stay per gateway, and a key's cap learned from
		// one gateway's count would be wrong for the fleet.
		if c.Provider.Adaptive != nil && len(c.Provider.APIKeys) > 0 {
			return Config{}, errors.New("config: provider.adaptive: with api_keys, each key's cap is learned per gateway, which a fleet does not support; set each key's max_concurrent_requests")
		}
	}
	if err := c.Provider.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: provider: %w", err)
	}
	if err := c.readAPIKeys(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// checkNames refuses the names of orgs and models that no request can
// carry, whose settings would never apply: over maxNameBytes (a request
// naming one is answered 400), an empty org (a request without
// OrgHeader is "default"; pacing refuses an empty model), or one that
// OrgHeader cannot carry (carriedInHeader).
func (c *Config) checkNames() error {
	for field, names := range map[string]iter.Seq[string]{
		"orgs.limits": maps.Keys(c.Orgs.Limits), "orgs.priorities": maps.Keys(c.Orgs.Priorities),
		"orgs.weights": maps.Keys(c.Orgs.Weights), "orgs.budgets": maps.Keys(c.Orgs.Budgets),
	} {
		for org := range names {
			if org == "" || len(org) > maxNameBytes {
				return fmt.Errorf("config: %s[%q]: not an org's name (1 to %d bytes)", field, org, maxNameBytes)
			}
			if !carriedInHeader(org) {
				return fmt.Errorf("config: %s[%q]: not an org's name (%s cannot carry it: spaces or tabs around it, or control characters but tabs in it)", field, org, OrgHeader)
			}
		}
	}
	for model := range c.Provider.Models {
		if len(model) > maxNameBytes {
			return fmt.Errorf("config: provider: models[%q]: not a model's name (at most %d bytes)", model, maxNameBytes)
		}
	}
	return nil
}

// readAPIKeys reads each API key's secret from the variable APIKeyEnv names.
func (c *Config) readAPIKeys() error {
	ids := make(map[string]bool, len(c.Provider.APIKeys))
	for _, k := range c.Provider.APIKeys {
		ids[k.ID] = true
	}
	c.apiKeys = make(map[string]string, len(c.APIKeyEnv))
	for id, name := range c.APIKeyEnv {
		if !ids[id] {
			return fmt.Errorf("config: api_key_env[%q]: no key with this id in provider.api_keys", id)
		}
		if name == "" {
			return fmt.Errorf("config: api_key_env[%q]: missing the variable's name", id)
		}
		secret, err := secretFromEnv(name)
		if err != nil {
			return fmt.Errorf("config: api_key_env[%q]: %w", id, err)
		}
		c.apiKeys[id] = secret
	}
	return nil
}
