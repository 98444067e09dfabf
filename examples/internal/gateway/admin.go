package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/sweep"
)

// maxOrgBytes bounds an org name in an admin path: it becomes a key of the
// limits map and of the tenant registry.
const maxOrgBytes = 256

// adminMux serves the admin and debug endpoints; requireToken guards it.
func (g *Gateway) adminMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/orgs/{org}/concurrent-limit", g.getOrgLimit)
	mux.HandleFunc("PATCH /admin/orgs/{org}/concurrent-limit", g.setOrgLimit)
	mux.HandleFunc("DELETE /admin/orgs/{org}/concurrent-limit", g.deleteOrgLimit)
	mux.Handle("GET /debug/slots", sweep.Handler(g.tenants))
	mux.HandleFunc("GET /debug/provider", g.debugProvider)
	return mux
}

// learnedCap is a learned cap in /debug/provider.
type learnedCap struct {
	Limit   int    `json:"limit"`   // the limit admissions run under now
	Cap     int    `json:"cap"`     // starts up to it go without a test
	Ceiling int    `json:"ceiling"` // the cap is at most this, as last seen
	Floor   int    `json:"floor"`
	Max     int    `json:"max"`
	Changes uint64 `json:"changes"`
}

func learnedOf(l pacing.Learned) *learnedCap {
	return &learnedCap{Limit: l.Limit, Cap: l.Cap, Ceiling: l.Ceiling, Floor: l.Floor, Max: l.Max, Changes: l.Changes}
}

// learnedOfEach is learnedOf of each of ls by name; nil for none.
func learnedOfEach(ls map[string]pacing.Learned) map[string]*learnedCap {
	if len(ls) == 0 {
		return nil
	}
	out := make(map[string]*learnedCap, len(ls))
	for name, l := range ls {
		out[name] = learnedOf(l)
	}
	return out
}

// debugProvider serves the provider gate's state in the naming style of
// /debug/slots: snake_case, durations in seconds; with learned caps, each
// one (with a fleet, as the fleet has it) and the answers by kind.
func (g *Gateway) debugProvider(w http.ResponseWriter, _ *http.Request) {
	st := g.gate.Status()
	out := struct {
		InFlight           int            `json:"in_flight"`
		Queued             int            `json:"queued"`
		InFlightByModel    map[string]int `json:"in_flight_by_model"`
		InFlightByKey      map[string]int `json:"in_flight_by_api_key"`
		NextStartInSeconds float64        `json:"next_start_in_seconds"`
		LastStart          *time.Time     `json:"last_start"` // null before the first
		Rejected           uint64         `json:"rejected"`
		Bypassed           uint64         `json:"bypassed"`
		// Learned is the provider's learned cap (null if not learned),
		// LearnedModels and LearnedKeys those of models and API keys.
		Learned          *learnedCap            `json:"learned,omitempty"`
		LearnedModels    map[string]*learnedCap `json:"learned_models,omitempty"`
		LearnedKeys      map[string]*learnedCap `json:"learned_api_keys,omitempty"`
		PausedForSeconds float64                `json:"paused_for_seconds"` // new starts wait this long for a Retry-After
		Answers          map[string]uint64      `json:"answers,omitempty"`  // the upstream's answers by kind
	}{
		InFlight: st.InFlight, Queued: st.Queued, InFlightByModel: st.ByModel, InFlightByKey: st.ByKey,
		NextStartInSeconds: st.NextStartIn.Seconds(), Rejected: st.Rejected, Bypassed: st.Bypassed,
	}
	if !st.LastStart.IsZero() {
		t := st.LastStart.UTC()
		out.LastStart = &t
	}
	l := g.Learned()
	out.PausedForSeconds = l.PausedFor.Seconds()
	if l.Floor > 0 {
		out.Learned = learnedOf(l)
	}
	out.LearnedModels = learnedOfEach(l.Models)
	out.LearnedKeys = learnedOfEach(l.Keys)
	if l.Enabled {
		out.Answers = map[string]uint64{}
		for kind, n := range l.ByKind {
			out.Answers[pacing.Kind(kind).String()] = n
		}
	}
	writeJSON(w, out)
}

// requireToken answers 401 unless the request carries "Authorization:
// Bearer <token>", the scheme in any case (RFC 7235). Both tokens are hashed
// first, so the comparison takes the same time whatever the length or
// content of what was sent.
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, credentials, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got := sha256.Sum256([]byte(credentials))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 || !strings.EqualFold(scheme, "Bearer") {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gateway admin"`)
			writeOpenAIError(w, http.StatusUnauthorized, "this endpoint needs the admin bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// orgFromPath returns the path's org, or answers 400 and returns "".
func orgFromPath(w http.ResponseWriter, r *http.Request) string {
	org := r.PathValue("org")
	if org == "" || len(org) > maxOrgBytes || !utf8.ValidString(org) {
		writeOpenAIError(w, http.StatusBadRequest, "org: want a name of 1 to 256 bytes of UTF-8")
		return ""
	}
	if !carriedInHeader(org) {
		writeOpenAIError(w, http.StatusBadRequest, "org: want a name an X-Org-ID header can carry: no spaces or tabs around it, no control characters but tabs in it")
		return ""
	}
	return org
}

// carriedInHeader reports whether a request can carry org in OrgHeader:
// net/http drops the spaces and tabs around a header's value, and answers
// 400 to one with a control character other than a tab in it. A limit set
// for another name would never apply.
func carriedInHeader(org string) bool {
	if strings.Trim(org, " \t") != org {
		return false
	}
	for i := range len(org) {
		if b := org[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}

func (g *Gateway) setOrgLimit(w http.ResponseWriter, r *http.Request) {
	org := orgFromPath(w, r)
	if org == "" {
		return
	}
	var body struct {
		Limit *int `json:"limit"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<10))
	dec.DisallowUnknownFields()
	err := dec.Decode(&body)
	if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
		err = errors.New("data after the object")
	}
	if err != nil || body.Limit == nil || *body.Limit < 0 {
		writeOpenAIError(w, http.StatusBadRequest, `want one JSON object, {"limit": N} with N >= 0`)
		return
	}
	n := *body.Limit
	old, from := g.orgLimitFrom(org)
	ctx, cancel := context.WithTimeout(r.Context(), adminStoreTimeout)
	defer cancel()
	if err := g.orgs().Set(ctx, org, n); err != nil {
		g.changeFailed(w, r, "set", org, err)
		return
	}
	g.refreshOrg(org)
	g.log.Info("gateway: org limit set", slog.String("org", org), slog.Int("old", old), slog.Int("new", n),
		slog.String("was_from", from), slog.String("remote", r.RemoteAddr))
	g.writeOrgLimit(w, org, n, fromOverride)
}

// getOrgLimit tells an org's limit and where it comes from.
func (g *Gateway) getOrgLimit(w http.ResponseWriter, r *http.Request) {
	org := orgFromPath(w, r)
	if org == "" {
		return
	}
	n, from := g.orgLimitFrom(org)
	g.writeOrgLimit(w, org, n, from)
}

// deleteOrgLimit removes an org's override: the limit the config gives
// it (orgs.limits, else orgs.default_limit) applies again.
func (g *Gateway) deleteOrgLimit(w http.ResponseWriter, r *http.Request) {
	org := orgFromPath(w, r)
	if org == "" {
		return
	}
	old, _ := g.orgLimitFrom(org)
	ctx, cancel := context.WithTimeout(r.Context(), adminStoreTimeout)
	defer cancel()
	had, err := g.orgs().Delete(ctx, org)
	if err != nil {
		g.changeFailed(w, r, "remove", org, err)
		return
	}
	n, from := g.configuredLimit(org)
	if !had {
		writeOpenAIError(w, http.StatusNotFound, "this org's limit is the configured one: nothing to remove")
		return
	}
	g.refreshOrg(org)
	g.log.Info("gateway: org limit removed", slog.String("org", org), slog.Int("old", old), slog.Int("new", n),
		slog.String("now_from", from), slog.String("remote", r.RemoteAddr))
	g.writeOrgLimit(w, org, n, from)
}

// adminStoreTimeout bounds a change's calls to the fleet's store.
const adminStoreTimeout = 5 * time.Second

// changeFailed answers a change the overrides did not take: 409 when there
// are too many (with or without a fleet), else 503 (the fleet's store did
// not answer, or other gateways changed them at every try).
func (g *Gateway) changeFailed(w http.ResponseWriter, r *http.Request, what, org string, err error) {
	if errors.Is(err, fleet.ErrOverridesFull) {
		writeOpenAIError(w, http.StatusConflict, "as many org limits are set as can be: remove some first")
		return
	}
	if r.Context().Err() == nil {
		g.log.Warn("gateway: org limit not changed: the fleet's store failed", slog.String("org", org),
			slog.String("change", what), slog.Any("error", err))
	}
	writeOpenAIError(w, http.StatusServiceUnavailable,
		"the fleet's store did not take the change: it may or may not have been made; GET tells what this gateway knows")
}

// orgLimitAnswer is the admin API's answer about an org's limit: the limit
// in force, where it comes from (override, config or default), the
// configured limit a DELETE goes back to, and the reach of a change: with
// a fleet, every gateway of the fleet, kept in its store across restarts
// (Synced: whether this gateway has read the fleet's overrides yet; until
// it has, it applies none it did not set itself); without one, this
// gateway alone, until it restarts.
type orgLimitAnswer struct {
	Org        string `json:"org"`
	Limit      int    `json:"limit"`
	Source     string `json:"source"`
	Configured int    `json:"configured"`
	Scope      string `json:"scope"`            // "fleet" or "this gateway"
	Persisted  bool   `json:"persisted"`        // false: lost on restart
	Synced     *bool  `json:"synced,omitempty"` // with a fleet only
}

func (g *Gateway) writeOrgLimit(w http.ResponseWriter, org string, n int, from string) {
	configured, _ := g.configuredLimit(org)
	a := orgLimitAnswer{Org: org, Limit: n, Source: from, Configured: configured, Scope: "this gateway"}
	if ov, shared := g.orgs().(*fleet.Overrides); shared {
		synced := ov.Synced()
		a.Scope, a.Persisted, a.Synced = "fleet", true, &synced
	}
	writeJSON(w, a)
}

// orgOverrides are the orgs' limits set through the admin API: with a
// fleet, a fleet.Overrides (every gateway's, kept in the store), else
// localOverrides.
type orgOverrides interface {
	Get(org string) (int, bool)
	Set(ctx context.Context, org string, n int) error
	Delete(ctx context.Context, org string) (bool, error)
}

// localOverrides are this gateway's own overrides, kept in memory: as
// many as a fleet's (fleet.MaxOverrides), so that orgs sent without end
// do not grow the gateway without end, and a PATCH past them is a 409 as
// with a fleet.
type localOverrides struct {
	mu sync.Mutex
	m  map[string]int
}

func (l *localOverrides) Get(org string) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.m[org]
	return n, ok
}

func (l *localOverrides) Set(_ context.Context, org string, n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[org]; !ok && len(l.m) >= fleet.MaxOverrides {
		return fmt.Errorf("%w: %q: %d orgs already", fleet.ErrOverridesFull, org, fleet.MaxOverrides)
	}
	l.m[org] = n
	return nil
}

func (l *localOverrides) Delete(_ context.Context, org string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, had := l.m[org]
	delete(l.m, org)
	return had, nil
}

// refreshOrg makes every key of the org, live or idle, fetch its limit at
// its next admission.
func (g *Gateway) refreshOrg(org string) {
	g.tenants.RefreshLimits(func(k tenant) bool { return k.Org == org })
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// orgLimit returns an org's limit in force.
func (g *Gateway) orgLimit(org string) int {
	n, _ := g.orgLimitFrom(org)
	return n
}

// Where an org's limit comes from (orgLimitFrom).
const (
	fromOverride = "override" // set through the admin API
	fromConfig   = "config"   // orgs.limits
	fromDefault  = "default"  // orgs.default_limit
)

// orgLimitFrom returns an org's limit and where it comes from.
func (g *Gateway) orgLimitFrom(org string) (int, string) {
	if n, ok := g.orgs().Get(org); ok {
		return n, fromOverride
	}
	return g.configuredLimit(org)
}

// orgs returns the orgs' overrides.
func (g *Gateway) orgs() orgOverrides {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.overrides
}

// configuredLimit returns the limit the config gives an org, and whether
// it names the org (fromConfig) or not (fromDefault).
func (g *Gateway) configuredLimit(org string) (int, string) {
	if n, ok := g.configured[org]; ok {
		return n, fromConfig
	}
	return g.defLimit, fromDefault
}
