// Package inflight caps how many requests are in flight to a rate-limited
// upstream, with RAII-style slots: an admission returns a *slots.Slot that
// holds its capacity until it is released, and a streamed response keeps its
// slot until its body is closed.
//
// The root package holds no code; pick the package for the job:
//
//	need                                            package
//	one cap for a server or an upstream             slots    (Limiter)
//	a slot that lives as long as a response body    slots    (WrapBody, Transport, Middleware)
//	a cap per key: tenant, model, API key           registry (Registry)
//	several caps at once, all or nothing            registry (AcquireAll)
//	one cap across a fleet of processes             registry/fleet (its own module; Redis or PostgreSQL)
//	a provider's caps and start pacing together     pacing   (Config, Gate)
//	tokens in flight, token budgets per minute      pacing   (AcquireTokens, Budget); a fleet's: registry/fleet (Budget)
//	a cap learned from the upstream's 429s          pacing   (AdaptiveConfig); a fleet's: registry/fleet (Learn)
//	what holds the caps, long-held reports          sweep    (Monitor)
//	"nothing left held" at the end of a test        slots/slotstest, registry/registrytest
//	Prometheus metrics (its own module)             sweep/inflightprom
//	OpenTelemetry metrics and traces (own module)   sweep/inflightotel
//
// Every package counts live holders, never a counter that can drift: time
// never frees a slot, a key with a live holder is never removed, and releasing
// a slot twice does nothing.
package inflight
