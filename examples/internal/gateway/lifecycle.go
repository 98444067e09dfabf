// The gateway's life beside its requests: how many it serves, the drain,
// and closing.

package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// Active returns the number of model requests being served now (a stream
// counts until it has been relayed to its end).
func (g *Gateway) Active() int {
	g.activeMu.Lock()
	defer g.activeMu.Unlock()
	return g.active
}

func (g *Gateway) enter() {
	g.activeMu.Lock()
	g.active++
	g.activeMu.Unlock()
}

func (g *Gateway) leave() {
	g.activeMu.Lock()
	defer g.activeMu.Unlock()
	g.active--
	if g.active == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// Drain ends the waits for the provider: the requests waiting, and any
// that arrive from now on, are answered 503 with Retry-After and
// "Connection: close", so that their clients retry on another gateway
// instead of starting a stream this one would cut. Requests already
// upstream go on. Call it as the server's shutdown starts.
func (g *Gateway) Drain() { g.drain() }

// drainRetryAfter is the Retry-After of a request turned away by Drain:
// another gateway, or this one restarted, can take it at once.
const drainRetryAfter = time.Second

// WaitIdle waits until no model request is being served and, with a fleet,
// until this process holds no lease, or until ctx is done; it reports
// whether that point was reached. After the servers have been closed, it
// lets the handlers that were cut release their slots before Close, so
// that no lease is left in Redis until it expires.
func (g *Gateway) WaitIdle(ctx context.Context) bool {
	g.activeMu.Lock()
	var idle chan struct{}
	if g.active > 0 {
		if g.idle == nil {
			g.idle = make(chan struct{})
		}
		idle = g.idle
	}
	g.activeMu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			return false
		}
	}
	if g.fleetTenants == nil {
		return true
	}
	// A cut stream's provider slot lingers (cut_linger_ms) after its
	// handler has returned, on a timer that tells nobody: look now and then.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for g.fleetTenants.Stats().Held+g.caps.Stats().Held > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// Ping checks that the fleet's store answers (and, with
// postgres_listen_url, that its database takes a connection: it makes
// one); nil without a fleet.
func (g *Gateway) Ping(ctx context.Context) error {
	switch {
	case g.rdb != nil:
		return g.rdb.Ping(ctx).Err()
	case g.pool != nil:
		if err := g.pool.Ping(ctx); err != nil {
			return err
		}
		if g.listen != nil {
			conn, err := pgx.ConnectConfig(ctx, g.listen)
			if err != nil {
				return fmt.Errorf("postgres_listen_url: %w", err)
			}
			return conn.Close(ctx)
		}
	}
	return nil
}

// Close stops the gateway's background work.
func (g *Gateway) Close() {
	if g.drain != nil {
		g.drain()
	}
	if g.monitor != nil {
		g.monitor.Stop()
	}
	if g.gate != nil {
		g.gate.Close()
	}
	if ov, ok := g.orgs().(*fleet.Overrides); ok {
		ov.Close()
	}
	if g.fleetTenants != nil {
		g.fleetTenants.Close()
	}
	if g.caps != nil {
		g.caps.Close()
	}
	if g.rdb != nil {
		g.rdb.Close()
	}
	if g.pool != nil {
		g.pool.Close()
	}
	// The last spans and points, sent within a bound: a collector that
	// does not answer does not hold the exit.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.tel.close(ctx); err != nil {
		g.log.Warn("gateway: telemetry: the last export failed", slog.Any("error", err))
	}
}

// rejectWait answers a provider wait that ended without a grant: when
// Drain ended it (the client is still there) with 503, "Connection: close"
// and the cap named as the provider's metrics count the wait cancelled
// ("provider", whose queue it waited in, whichever of the provider's caps
// held it), for the reason "shutting_down"; else as reject does.
func (g *Gateway) rejectWait(w http.ResponseWriter, r *http.Request, model string, err error) {
	capName := refusedBy(err)
	if g.draining.Err() != nil && r.Context().Err() == nil {
		requestInfoFrom(r.Context()).refusedBy = capName
		w.Header().Set("Connection", "close")
		w.Header().Set(CapHeader, capName)
		slots.SetRetryAfter(w.Header(), drainRetryAfter)
		writeOpenAIErrorWith(w, http.StatusServiceUnavailable, "the gateway is shutting down; retry the request", capName, "shutting_down")
		return
	}
	g.reject(w, r, capName, model, err)
}
