package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/slots"
)

// The caps a fleet of gateways shares on Redis or PostgreSQL: the org
// caps, and the provider's and models' caps, configured or learned.

// fleetStores returns the stores of the org caps and of the provider's
// caps, on cfg.Fleet's Redis or database.
func (g *Gateway) fleetStores(cfg Config) (tenants, provider driver.Store, err error) {
	if u := cfg.Fleet.PostgresURL; u != "" {
		pc, _ := pgxpool.ParseConfig(u) // checked by ParseConfig
		pc.ConnConfig.ConnectTimeout = time.Second
		var opts []pgstore.Option
		if lu := cfg.Fleet.PostgresListenURL; lu != "" {
			// Through PgBouncer: pgx's statement cache is session state.
			if !namesExecMode(u) {
				pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			}
			lc, _ := pgxpool.ParseConfig(lu) // checked by ParseConfig; pool_* settings are not the server's
			lc.ConnConfig.ConnectTimeout = time.Second
			g.listen = lc.ConnConfig
			opts = append(opts, pgstore.WithListenConfig(lc.ConnConfig))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if g.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, nil, fmt.Errorf("fleet: postgres: %w", err)
		}
		t, err := pgstore.New(ctx, g.pool, "tenants", opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("fleet: postgres: %w", err)
		}
		p, err := pgstore.New(ctx, g.pool, "provider", opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("fleet: postgres: %w", err)
		}
		return t, p, nil
	}
	opt, _ := redis.ParseURL(cfg.Fleet.RedisURL) // checked by ParseConfig
	// Reads and writes end at the fleet's timeout (timeout_ms), not before:
	// go-redis ends each at the sooner of its own timeout and the call's.
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 250*time.Millisecond, cfg.Fleet.timeout(), cfg.Fleet.timeout()
	opt.ContextTimeoutEnabled, opt.MaxRetries, opt.Protocol = true, 1, 2
	if u, err := url.Parse(cfg.Fleet.RedisURL); err == nil && u.Query().Get("pool_size") == "" {
		opt.PoolSize = max(opt.PoolSize, 64) // token budgets make a call per request (see redisstore)
	}
	g.rdb = redis.NewClient(opt)
	return redisstore.New(g.rdb, "tenants"), redisstore.New(g.rdb, "provider"), nil
}

// namesExecMode reports whether the PostgreSQL connection string u (a URL
// or keyword/value pairs) sets pgx's default_query_exec_mode.
func namesExecMode(u string) bool {
	const key = "default_query_exec_mode"
	if p, err := url.Parse(u); err == nil && p.Scheme != "" {
		return p.Query().Has(key)
	}
	for _, f := range strings.Fields(u) {
		if k, _, ok := strings.Cut(f, "="); ok && strings.TrimSpace(k) == key {
			return true
		}
	}
	return false
}

// startFleet makes the org caps and the provider and model caps hold
// across every gateway on cfg.Fleet's store, and returns the provider
// config left to the Gate: its pacing and API-key caps, which stay per
// process. It fails if the store's schema cannot be made (PostgreSQL).
func (g *Gateway) startFleet(cfg Config, local []registry.Option) (pacing.Config, error) {
	tenantStore, providerStore, err := g.fleetStores(cfg)
	if err != nil {
		return pacing.Config{}, err
	}
	ttl := cfg.Fleet.leaseTTL()
	onUnavailable, _ := fleet.ParseUnavailable(cfg.Fleet.OnUnavailable) // checked by ParseConfig
	common := []fleet.Option{fleet.WithLeaseTTL(ttl), fleet.WithUnavailable(onUnavailable), fleet.WithLogger(g.log),
		fleet.WithTimeout(cfg.Fleet.timeout())}
	if f := cfg.Fleet.LearnedFormat; f != 0 {
		common = append(common, fleet.WithLearnedFormat(f)) // checked by ParseConfig
	}

	tenantKeys := fleet.Keys[tenant]{
		Name:  func(k tenant) string { return strconv.Quote(k.Org) + "/" + strconv.Quote(k.Model) },
		Limit: func(k tenant) int { return g.orgLimit(k.Org) },
	}
	tenantOpts := append(common, fleet.WithLocalOptions(local...))
	g.fleetTenants = fleet.NewWithKeys(tenantStore, cfg.Orgs.DefaultLimit, tenantKeys, tenantOpts...)
	g.tenants = g.fleetTenants.Local()
	g.admitTenant = g.fleetTenants.TryAcquire
	// The admin API's overrides are the fleet's: set through one gateway,
	// they hold on all of them, and outlive their restarts.
	ov, err := fleet.NewOverrides(tenantStore, "org-limits", g.refreshOrg, g.log)
	if err != nil {
		return pacing.Config{}, err
	}
	g.mu.Lock()
	g.overrides = ov
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := ov.Sync(ctx); err != nil {
		g.log.Warn("gateway: the orgs' overrides were not read from the fleet's store; they are read again each second",
			slog.Any("error", err))
	}

	// The provider's queue policy bounds the fleet's queue too: a request
	// waits there first, then for this gateway's pacing.
	wait := []registry.Option{slots.WithMaxQueue(cfg.Provider.QueueLimit()), slots.WithMaxWait(cfg.Provider.QueueWait())}
	if n := cfg.Provider.MaxQueuePerFlow; n != nil {
		wait = append(wait, slots.WithMaxQueuePerFlow(*n))
	}
	if cfg.Provider.FailOpen() {
		wait = append(wait, slots.WithFailOpen())
	}
	providerOpts := append(common, fleet.WithLocalOptions(wait...))
	g.caps = fleet.New[string](providerStore, slots.Unlimited, providerOpts...)
	// The caps, configured or learned, are the fleet's: the Gate keeps
	// the pacing.
	provider := cfg.Provider
	if n := provider.MaxConcurrentRequests; n > 0 {
		g.caps.SetLimit("provider", n)
	}
	if a := provider.Adaptive; a != nil {
		_ = g.caps.Learn("provider", *a) // checked by ParseConfig
		g.fleetLearns = true
	}
	// The caps on tokens in flight too: weighed leases, fleet wide.
	if n := provider.MaxInflightTokens; n > 0 {
		g.caps.SetLimit(pacing.FleetTokens, n)
	}
	provider.MaxConcurrentRequests, provider.Adaptive, provider.MaxInflightTokens = 0, nil, 0
	// So are the budgets per minute: the provider's and the models',
	// reserved in the store before the Gate; the org's too.
	g.fleetBudgets = &fleetBudgets{tenants: tenantStore, models: map[string]*fleet.Budget{}, closed: onUnavailable == fleet.FailClosed, timeout: cfg.Fleet.timeout(),
		uncountedLog: rejectLog{every: 10 * time.Second}}
	if provider.BudgetLimits != (pacing.BudgetLimits{}) {
		if g.fleetBudgets.provider, err = fleet.NewBudget(providerStore, "provider", provider.BudgetLimits, g.fleetBudgets.timeout); err != nil {
			return pacing.Config{}, err
		}
	}
	provider.BudgetLimits = pacing.BudgetLimits{}
	provider.Models = make(map[string]pacing.ModelConfig, len(cfg.Provider.Models))
	for name, m := range cfg.Provider.Models {
		if m.BudgetLimits != (pacing.BudgetLimits{}) {
			if g.fleetBudgets.models[name], err = fleet.NewBudget(providerStore, "model:"+name, m.BudgetLimits, g.fleetBudgets.timeout); err != nil {
				return pacing.Config{}, err
			}
		}
		m.BudgetLimits = pacing.BudgetLimits{}
		if m.MaxConcurrentRequests > 0 {
			g.caps.SetLimit("model:"+name, m.MaxConcurrentRequests)
		}
		if m.Adaptive != nil {
			_ = g.caps.Learn("model:"+name, *m.Adaptive) // checked by ParseConfig
			g.fleetLearns = true
			g.fleetModels = append(g.fleetModels, name)
		}
		if m.MaxInflightTokens > 0 {
			g.caps.SetLimit(pacing.FleetModelTokens+name, m.MaxInflightTokens)
		}
		m.MaxConcurrentRequests, m.Adaptive, m.MaxInflightTokens = 0, nil, 0
		provider.Models[name] = m
	}
	return provider, nil
}
