package gateway

import (
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// The caps a fleet of gateways shares on Redis: the org caps, and the
// provider's and models' caps, configured or learned.

// startFleet makes the org caps and the provider and model caps hold
// across every gateway on cfg.Fleet's Redis, and returns the provider
// config left to the Gate: its pacing and API-key caps, which stay per
// process.
func (g *Gateway) startFleet(cfg Config, local []registry.Option) pacing.Config {
	opt, _ := redis.ParseURL(cfg.Fleet.RedisURL) // checked by ParseConfig
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 250*time.Millisecond, 250*time.Millisecond, 250*time.Millisecond
	opt.ContextTimeoutEnabled, opt.MaxRetries, opt.Protocol = true, 1, 2
	g.rdb = redis.NewClient(opt)
	ttl := fleet.DefaultLeaseTTL
	if cfg.Fleet.LeaseTTLMS > 0 {
		ttl = millis(cfg.Fleet.LeaseTTLMS)
	}
	onUnavailable, _ := fleet.ParseUnavailable(cfg.Fleet.OnUnavailable) // checked by ParseConfig
	common := []fleet.Option{fleet.WithLeaseTTL(ttl), fleet.WithUnavailable(onUnavailable), fleet.WithLogger(g.log)}

	g.fleetTenants = fleet.NewWithKeys(g.rdb, "tenants", cfg.Orgs.DefaultLimit, fleet.Keys[tenant]{
		Name:  func(k tenant) string { return strconv.Quote(k.Org) + "/" + strconv.Quote(k.Model) },
		Limit: func(k tenant) int { return g.orgLimit(k.Org) },
	}, append(common, fleet.WithLocalOptions(local...))...)
	g.tenants = g.fleetTenants.Local()
	g.admitTenant = g.fleetTenants.TryAcquire

	// The provider's queue policy bounds the fleet's queue too: a request
	// waits there first, then for this gateway's pacing.
	wait := []registry.Option{slots.WithMaxQueue(cfg.Provider.QueueLimit()), slots.WithMaxWait(cfg.Provider.QueueWait())}
	if n := cfg.Provider.MaxQueuePerFlow; n > 0 {
		wait = append(wait, slots.WithMaxQueuePerFlow(n))
	}
	if cfg.Provider.FailOpen() {
		wait = append(wait, slots.WithFailOpen())
	}
	g.caps = fleet.New[string](g.rdb, "provider", slots.Unlimited, append(common, fleet.WithLocalOptions(wait...))...)
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
	provider.MaxConcurrentRequests, provider.Adaptive = 0, nil
	provider.Models = make(map[string]pacing.ModelConfig, len(cfg.Provider.Models))
	for name, m := range cfg.Provider.Models {
		if m.MaxConcurrentRequests > 0 {
			g.caps.SetLimit("model:"+name, m.MaxConcurrentRequests)
		}
		if m.Adaptive != nil {
			_ = g.caps.Learn("model:"+name, *m.Adaptive) // checked by ParseConfig
			g.fleetLearns = true
			g.fleetModels = append(g.fleetModels, name)
		}
		m.MaxConcurrentRequests, m.Adaptive = 0, nil
		provider.Models[name] = m
	}
	return provider
}

// capKeys returns the fleet keys a request for model takes.
func (g *Gateway) capKeys(model string) []string {
	if g.caps.Limit("model:"+model) != slots.Unlimited {
		return []string{"provider", "model:" + model}
	}
	return []string{"provider"}
}
