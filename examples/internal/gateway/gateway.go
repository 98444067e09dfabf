// Package gateway is the OpenAI-compatible proxy shared by the example
// programs: a tenant cap per (org, model) answered at once, the provider's
// caps and pacing waited for, every slot of a streamed answer held until the
// upstream body closes. The provider's slots of a stream cut midway stay
// held a little longer (Config.CutLingerMS), until the upstream has
// noticed the cut.
//
// Requests wait for the provider by priority class (the X-Priority header,
// or the org's configured class) and, within a class, orgs take turns (the
// X-Org-ID header; weighted by the config), so a batch backlog does not
// delay interactive users and one org's backlog does not delay another's.
// With a fleet, the provider and model caps shared on Redis are waited for
// first, in one queue for the whole fleet: by class, then org turns, then
// arrival (shares do not apply there), bounded by the provider's
// max_queue, max_queue_per_flow and max_queue_wait_ms; the wait for this
// gateway's pacing follows, with all of them.
// The example trusts both headers; a real gateway sets them from the
// caller's authenticated identity.
//
// For operators: the admin and debug endpoints are served only with
// Config.Admin, behind its bearer token (admin.go); /metrics exports every
// cap as inflight_* series told apart by the label cap (metrics.go); errors
// are answered in OpenAI's shape, a cap of 0 with 403 rather than 429
// (openai.go); rejections are logged at most once a second, each request at
// debug level with its wait and caps (logging.go); with Config.Telemetry,
// traces (the provider wait as a span of its own) and metrics go over OTLP
// as well (telemetry.go).
//
// Every answer of the upstream to a request that holds a provider grant is
// reported to the provider's Gate, before the grant's slots can be freed
// (see reporter): with provider.adaptive (or a model's adaptive section) the
// Gate learns the upstream's hidden concurrency cap from them, and in any
// case a rate or overload answer's Retry-After pauses new starts (at most
// 10 s) and a quota answer takes its API key out of the pool for a while.
package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// tenant is the key of the per-organisation cap: an org's requests to one model.
type tenant struct{ Org, Model string }

func (t tenant) String() string { return t.Org + "/" + t.Model }

// Gateway is an OpenAI-compatible reverse proxy with a tenant cap per
// (org, model), checked at once, and the provider's caps and pacing, waited
// for. A streamed answer holds every slot until the upstream body closes.
type Gateway struct {
	// tenants holds this process's tenant slots: the only cap, or with a
	// fleet the local mirror of fleetTenants (for sweeps and metrics).
	tenants     *registry.Registry[tenant]
	admitTenant func(tenant) (*slots.Slot, error)
	// tenantEvents observes the tenant cap's admissions; tenantRefused
	// counts its refusals by reason, with those of orgs switched off (made
	// before the cap) and over their budgets (made after it).
	tenantEvents  slots.Observer
	tenantRefused refusalCounts
	fleetTenants  *fleet.Registry[tenant] // nil without a fleet
	caps          *fleet.Registry[string] // the provider and model caps across the fleet; nil without one
	fleetLearns   bool                    // some of caps are learned
	fleetModels   []string                // the models whose caps the fleet learns
	rdb           *redis.Client           // the fleet's on Redis; nil without one
	pool          *pgxpool.Pool           // the fleet's on PostgreSQL; nil without one
	listen        *pgx.ConnConfig         // the fleet's listening connection's (postgres_listen_url); nil: the pool's
	gate          *pacing.Gate
	monitor       *sweep.Monitor[tenant]
	sweepOpts     []sweep.Option // WithSweep's
	proxy         *httputil.ReverseProxy
	public        http.Handler // the model API and /metrics (and admin without its own listener)
	admin         http.Handler // the admin and debug endpoints behind the token; nil without admin
	adminApart    bool         // admin is served on its own listener
	metrics       *prometheus.Registry
	prom          *inflightprom.Provider // the provider's caps on /metrics, counted from each request's Trace
	named         map[string]struct{}    // the models the config names; read-only after New
	// orgRejections counts refusals by org, with metrics.per_org; else nil.
	orgRejections *prometheus.CounterVec
	apiKeys       map[string]string // each API key's secret, by id; read-only after New
	log           *slog.Logger
	rejections    rejectLog
	tel           *telemetry                        // nil without telemetry
	tokens        *estimator                        // counts requests' tokens; nil without a token cap or budget
	budgets       bool                              // the provider has token budgets per minute
	orgBudgets    *pacing.Budgets[string]           // the orgs' budgets; nil without
	orgLimits     func(string) *pacing.BudgetLimits // an org's budget limits (nil: none)
	fleetBudgets  *fleetBudgets                     // with a fleet, the budgets in its store; else nil

	// draining is done once Drain is called: it ends the provider waits.
	draining context.Context
	drain    context.CancelFunc

	activeMu sync.Mutex    // protects the fields below
	active   int           // model requests being served
	idle     chan struct{} // closed when active drops to 0; nil when nobody waits

	// configured are the orgs' limits in the config; read-only after New.
	configured map[string]int
	defLimit   int // orgs.default_limit; read-only after New

	mu        sync.RWMutex // protects the field below
	overrides orgOverrides // the orgs' limits set through the admin API

	priorities map[string]slots.Priority // read-only after New
	weights    map[string]int            // read-only after New
}

// OrgHeader names the org a request is for: its tenant cap, and its flow
// in the provider's queue. The example trusts it; a real gateway derives
// the org from the caller's credentials.
const OrgHeader = "X-Org-ID"

var errUnexpectedUpgrade = errors.New("gateway: the upstream switched protocols")

// exchangeKey carries a model request's exchange from the handler to the
// proxy's ErrorHandler.
type exchangeKey struct{}

// exchange is what the handler learns of a model request's admission by
// the provider's Transport.
type exchange struct {
	model    string
	org      string
	admitted *pacing.Admission // nil: not admitted
	refused  error             // the provider's refusal, if any
	spent    *spending         // its reservations of the budgets kept beside the Gate's
}

// An Option configures a Gateway.
type Option func(*Gateway)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(g *Gateway) { g.log = l } }

// New returns a Gateway for cfg that sends upstream through base.
func New(cfg Config, base http.RoundTripper, opts ...Option) (*Gateway, error) {
	target, err := url.Parse(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	g := &Gateway{configured: map[string]int{}, overrides: &localOverrides{m: map[string]int{}}, defLimit: cfg.Orgs.DefaultLimit, metrics: prometheus.NewRegistry(), log: slog.Default()}
	for _, o := range opts {
		o(g)
	}
	g.rejections.every = time.Second
	g.apiKeys = cfg.apiKeys
	g.draining, g.drain = context.WithCancel(context.Background())
	for org, n := range cfg.Orgs.Limits {
		g.configured[org] = n
	}
	g.priorities = make(map[string]slots.Priority, len(cfg.Orgs.Priorities))
	for org, name := range cfg.Orgs.Priorities {
		if g.priorities[org], err = slots.ParsePriority(name); err != nil {
			return nil, err
		}
	}
	g.weights = cfg.Orgs.Weights
	g.budgets = budgetsTokens(cfg.Provider)
	g.orgBudgets, g.orgLimits = newOrgBudgets(cfg.Orgs)
	if capsTokens(cfg.Provider) || g.orgBudgets != nil {
		if g.tokens, err = newEstimator(cfg.Tokens); err != nil {
			return nil, err
		}
	}
	if err := g.startTelemetry(cfg); err != nil {
		g.Close()
		return nil, err
	}
	collector := inflightprom.New("tenant")
	// An org's limit applies to each of its models, looked up per key; a
	// PATCH marks the org's cached limits due (RefreshLimits).
	g.tenantEvents = g.tenantObserver(collector)
	local := []registry.Option{slots.WithObserver(g.tenantEvents), slots.WithLogger(g.log)}
	provider := cfg.Provider
	if cfg.Fleet != nil {
		if provider, err = g.startFleet(cfg, local); err != nil {
			g.Close()
			return nil, err
		}
	} else {
		orgLimit := func(_ context.Context, k tenant) (int, error) { return g.orgLimit(k.Org), nil }
		g.tenants = registry.NewWithLimitFunc(cfg.Orgs.DefaultLimit, orgLimit, time.Minute, local...)
		g.admitTenant = g.tenants.TryAcquire
	}
	if g.gate, err = pacing.NewGate("provider", provider, slots.WithLogger(g.log)); err != nil {
		g.Close()
		return nil, err
	}
	g.watchTenants(collector)
	g.registerMetrics(cfg)
	if err := g.watchTelemetry(); err != nil {
		g.Close()
		return nil, err
	}
	g.monitor = sweep.New(g.tenants, g.sweepOptions()...)

	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
		},
		Transport: g.providerTransport(cfg, base),
		// The model API never switches protocols; httputil.ReverseProxy
		// would leave an unasked-for 101's connection (and so its slot)
		// open, so such an answer is an error, whose body the proxy closes.
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode == http.StatusSwitchingProtocols {
				return errUnexpectedUpgrade
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client has gone: nobody to answer
			}
			if x, _ := r.Context().Value(exchangeKey{}).(*exchange); x != nil && x.refused != nil {
				g.rejectWait(w, r, x.model, x.refused)
				return
			}
			var bad *slots.BadRequestError
			if errors.As(err, &bad) { // not a model request's: it has its model
				writeOpenAIError(w, http.StatusBadRequest, bad.Reason)
				return
			}
			g.log.Warn("gateway: upstream error", slog.String("path", r.URL.Path), slog.Any("error", err))
			writeOpenAIError(w, http.StatusBadGateway, "the upstream could not be reached")
		},
	}
	public := http.NewServeMux()
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		public.HandleFunc("POST "+p, g.model)
	}
	public.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		// No model, so its body (a GET has none to read) is not looked at.
		g.proxy.ServeHTTP(w, r.WithContext(pacing.WithModelName(slots.WithoutSlot(r.Context()), "")))
	})
	public.Handle("GET /metrics", promhttp.HandlerFor(g.metrics, promhttp.HandlerOpts{}))
	if cfg.Admin != nil {
		token, _ := cfg.Admin.token() // checked by ParseConfig
		g.admin = requireToken(token, g.adminMux())
		g.adminApart = cfg.Admin.Listen != ""
		if !g.adminApart {
			public.Handle("/admin/", g.admin)
			public.Handle("/debug/", g.admin)
		}
	}
	g.public = g.tracedHandler(g.logRequests(public))
	return g, nil
}

// ServeHTTP implements http.Handler: the model API, /metrics, and the
// admin and debug endpoints unless they have a listener of their own.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.public.ServeHTTP(w, r) }

// AdminHandler returns the admin and debug endpoints, behind the token, when
// the config gives them a listener of their own (admin.listen); nil
// otherwise.
func (g *Gateway) AdminHandler() http.Handler {
	if !g.adminApart {
		return nil
	}
	return g.logRequests(g.admin)
}

// Provider returns the provider gate's status.
func (g *Gateway) Provider() pacing.Status { return g.gate.Status() }

// TurnedAway returns how many requests the provider's caps turned away
// (the queue full, a wait too long), waiting for the Gate or, with a fleet,
// for the fleet's caps.
func (g *Gateway) TurnedAway() uint64 {
	var n uint64
	st, _ := g.prom.Snapshot("provider")
	for _, v := range st.Counts.Rejected {
		n += v
	}
	return n
}

// Learned returns the state of the provider's learned caps (its own and its
// models', as the fleet has them when it learns them), and how many of the
// upstream's answers were of each kind.
func (g *Gateway) Learned() pacing.Learned {
	l := g.gate.Learned()
	if !g.fleetLearns {
		return l
	}
	if p := g.caps.Learned("provider"); p.Enabled {
		p.ByKind, p.PausedFor = l.ByKind, l.PausedFor // what the Gate saw of every answer
		p.Models = l.Models
		l = p
	}
	for _, name := range g.fleetModels {
		if m := g.caps.Learned("model:" + name); m.Enabled {
			if l.Models == nil {
				l.Models = map[string]pacing.Learned{}
			}
			l.Enabled = true
			l.Models[name] = m
		}
	}
	return l
}

// TenantKeys returns the number of (org, model) keys holding or waiting.
func (g *Gateway) TenantKeys() int { return g.tenants.Keys() }

// model handles a model request: the tenant cap at once, then the provider's
// caps and pacing (waiting), then the upstream, holding both until done.
func (g *Gateway) model(w http.ResponseWriter, r *http.Request) {
	g.enter()
	defer g.leave()
	info := requestInfoFrom(r.Context())
	model, body, err := requestModel(r, maxBodyBytes)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errBodyTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		writeOpenAIError(w, status, err.Error())
		return
	}
	org := r.Header.Get(OrgHeader)
	if org == "" {
		org = "default"
	}
	// Both become keys in memory and in Redis, and labels of log lines
	// and metrics (which must be UTF-8).
	if len(org) > maxNameBytes {
		writeOpenAIError(w, http.StatusBadRequest, OrgHeader+": want a name of at most 256 bytes")
		return
	}
	if !utf8.ValidString(org) {
		writeOpenAIError(w, http.StatusBadRequest, OrgHeader+": want UTF-8")
		return
	}
	if len(model) > maxNameBytes {
		writeOpenAIError(w, http.StatusBadRequest, "model: want a name of at most 256 bytes")
		return
	}
	info.org, info.model = org, model
	var cost pacing.Tokens // the request's tokens, for the provider's token caps and budgets
	if g.tokens != nil && body != nil {
		if cost, err = g.tokens.estimate(body, model, r.URL.Path == "/v1/embeddings"); err != nil {
			writeOpenAIError(w, http.StatusBadRequest, slots.ErrorMessage(err))
			return
		}
	}
	// An org switched off is refused here, before any admission: the
	// answer is then the same whether the fleet's Redis is reachable or not.
	if g.orgLimit(org) == 0 {
		g.rejectDisabled(w, r, org, model)
		return
	}
	// The tenant's own cap: over it is the tenant's doing, answered at once.
	ts, err := g.admitTenant(tenant{org, model})
	if err != nil {
		g.rejectTenant(w, r, model, err)
		return
	}
	defer ts.Release() // the handler runs until the stream has been relayed
	// The provider's caps and pacing: waited for, to smooth the load, in
	// the order of priority class, then org turns, then arrival. Read
	// before the org's budget is charged: a bad header charges nothing.
	prio, ok := g.priorities[org]
	if h := r.Header.Get(slots.HeaderPriority); h != "" {
		if prio, err = slots.ParsePriority(h); err != nil {
			writeOpenAIError(w, http.StatusBadRequest, "X-Priority: want interactive, default or batch")
			return
		}
	} else if !ok {
		prio = slots.PriorityDefault
	}
	// The org's budget: over it, the request is answered at once. With a
	// fleet, the provider's and the model's are reserved by the provider's
	// Transport (reserveFleet), which starts, settles or cancels them all.
	spent, capName, err := g.reserveBudgets(r.Context(), tenant{org, model}, cost)
	if err != nil {
		g.rejectBudget(w, r, capName, model, err)
		return
	}
	defer spent.done() // the org's budget is kept while this request may settle into it
	// The provider's Transport waits for the fleet's caps and the Gate
	// under ctx, ended by Drain as well; the upstream exchange is not.
	ctx := slots.WithPriority(slots.WithFlowWeight(r.Context(), org, g.weights[org]), prio)
	ctx = pacing.WithWaitContext(pacing.WithModelName(ctx, model), g.draining)
	if cost.Total() > 0 {
		ctx = pacing.WithTokens(ctx, cost)
	}
	x := &exchange{model: model, org: org, spent: spent}
	defer func() {
		// Neither admitted nor refused: the proxy answered it before the
		// provider's Transport saw it (an Upgrade it cannot relay, say),
		// so it was never sent and charges nothing.
		if x.admitted == nil && x.refused == nil {
			_ = spent.Cancel(r.Context())
		}
	}()
	asked := time.Now()
	// The metrics' Traces first (inflightprom; inflightotel, under the
	// request's span), then the gateway's own.
	ctx = pacing.WithTrace(context.WithValue(ctx, exchangeKey{}, x), g.prom.Trace(model))
	if g.tel != nil {
		ctx = pacing.WithTrace(ctx, g.tel.provider.Trace(ctx))
	}
	ctx = pacing.WithTrace(ctx, &pacing.Trace{
		Admitted: func(a pacing.Admission) {
			x.admitted = &a
			info.waited, info.caps = a.Wait, g.capsHeld(a, model)
		},
		Refused: func(err error) {
			_ = spent.Cancel(r.Context()) // taken back by the Transport already, if it took it
			x.refused = err
			info.waited, info.refusedBy = time.Since(asked), refusedBy(err)
		},
	})
	g.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// providerTransport returns the proxy's Transport: the provider's caps
// (with a fleet, the fleet's first), its pacing and API keys, and every
// answer reported before the request's slots can go.
func (g *Gateway) providerTransport(cfg Config, base http.RoundTripper) http.RoundTripper {
	opts := []pacing.TransportOption{pacing.WithCutLinger(cfg.cutLinger())}
	if len(cfg.Provider.APIKeys) > 0 {
		// The pool's keys, and none for a request granted no key (a
		// bypass, a model listing): the client's own never goes upstream.
		opts = append(opts, pacing.WithCredential(pacing.BearerKeys(g.apiKeys)))
	}
	if g.caps != nil {
		opts = append(opts, pacing.WithFleet(g.caps))
		if capsInflightTokens(cfg.Provider) {
			opts = append(opts, pacing.WithFleetTokens(g.caps))
		}
	}
	if g.budgets || g.orgBudgets != nil {
		// Budgets settle with what a request used: a stream is asked for
		// its usage, which its client does not get unless it asked.
		opts = append(opts, pacing.WithStreamUsage())
	}
	if g.budgets || g.orgBudgets != nil || g.fleetBudgets != nil {
		opts = append(opts, pacing.WithFleetBudgets(g.reserveFleet))
	}
	if g.budgets || g.fleetBudgets != nil { // the Gate's budgets, and the fleet's (spending.Left)
		opts = append(opts, pacing.WithRateLimitHeaders())
	}
	return pacing.NewTransport(g.tracedTransport(base), g.gate, opts...)
}

// maxNameBytes bounds an org or model name: each is part of a key in
// memory and, with a fleet, in Redis.
const maxNameBytes = maxOrgBytes
