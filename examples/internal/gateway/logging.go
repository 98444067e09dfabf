package gateway

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// requestInfo is what the model handler learns about a request, for its
// log line.
type requestInfo struct {
	org, model string
	waited     time.Duration // for the provider's caps
	caps       []string      // the caps held, once admitted
	refusedBy  string        // the cap that refused it, if one did
}

type requestInfoKey struct{}

// requestInfoFrom returns the request's info to fill in; a request that
// did not pass through logRequests gets one nobody reads.
func requestInfoFrom(ctx context.Context) *requestInfo {
	if info, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		return info
	}
	return new(requestInfo)
}

// logRequests logs each request at info level once it has been answered:
// the access log, off below info (-log-level warn).
func (g *Gateway) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.log.Enabled(r.Context(), slog.LevelInfo) {
			next.ServeHTTP(w, r)
			return
		}
		info := new(requestInfo)
		rec := &statusRecorder{ResponseWriter: w}
		start := time.Now()
		served := false
		// Logged also when the handler panics: the proxy aborts a stream cut
		// by its client or by the upstream so (http.ErrAbortHandler).
		defer func() {
			if rec.status == 0 {
				rec.status = http.StatusOK
			}
			attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.String("org", info.org), slog.String("model", info.model), slog.Int("status", rec.status),
				slog.Duration("took", time.Since(start)), slog.Duration("waited", info.waited)}
			if info.caps != nil {
				attrs = append(attrs, slog.Any("caps", info.caps))
			}
			if info.refusedBy != "" {
				attrs = append(attrs, slog.String("refused_by", info.refusedBy))
			}
			if !served {
				attrs = append(attrs, slog.Bool("aborted", true))
			}
			g.log.LogAttrs(r.Context(), slog.LevelInfo, "gateway: request", attrs...)
		}()
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
		served = true
	})
}

// statusRecorder notes the status a handler answered with. Unwrap lets
// http.ResponseController reach the connection's Flush.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() { _ = http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// rejectLog lets one warning about rejections through per interval and
// counts the ones it held back, so a flood of 429s is one line a second.
type rejectLog struct {
	every time.Duration

	mu         sync.Mutex // protects the fields below
	last       time.Time
	suppressed int
}

// allow reports whether a line may be logged now, and how many were held
// back since the last one.
func (l *rejectLog) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}

// rejectDisabled answers a request of an org switched off (a limit of 0),
// refused before any admission, and counts it among the tenant cap's
// refusals as the cap's own would be: on /metrics (watchTenants), and to
// its Observer (the OpenTelemetry adapter, the request's trace).
func (g *Gateway) rejectDisabled(w http.ResponseWriter, r *http.Request, org, model string) {
	g.tenantRefused.add("limit_reached")
	g.tenantEvents.Observe(slots.Event{Kind: slots.EventRejected, Err: slots.ErrLimitReached, Context: r.Context()})
	g.reject(w, r, "tenant", model, &slots.LimitError{Err: slots.ErrLimitReached, Key: tenant{org, model}.String()})
}

// rejectTenant answers a request over its tenant cap. The cap's TryAcquire
// told its Observer without a context; the OpenTelemetry adapter is told
// here instead, with the request's, so that the refusal is on its trace
// (see tenantObserver).
func (g *Gateway) rejectTenant(w http.ResponseWriter, r *http.Request, model string, err error) {
	g.tenantRefused.add(rejectReason(err))
	if g.tel != nil {
		g.tel.tenants.Observe(slots.Event{Kind: slots.EventRejected, Err: err, Context: r.Context()})
	}
	g.reject(w, r, "tenant", model, err)
}

// rejectBudget answers a request refused by a budget (reserveBudgets) that
// capName names, and names it in the request's log line. A refusal by the
// org's own budget is counted among the tenant cap's refusals (which
// admitted the request first) as over_budget: on /metrics (watchTenants),
// and to its Observer. One by a fleet's budget of the provider or a model,
// or by their store held unavailable, is counted as the provider's caps
// count theirs.
func (g *Gateway) rejectBudget(w http.ResponseWriter, r *http.Request, capName, model string, err error) {
	switch {
	case !strings.HasPrefix(capName, "tenant"):
		g.providerRefused(r.Context(), model, err)
	case errors.Is(err, pacing.ErrOverBudget):
		g.tenantRefused.add("over_budget")
		g.tenantEvents.Observe(slots.Event{Kind: slots.EventRejected, Err: err, Context: r.Context()})
	}
	g.reject(w, r, capName, model, err)
}

// providerRefused counts a refusal of the provider's or a model's (a
// fleet's budget of theirs) that was made outside the provider's
// Transport, whose Traces count the rest: the metrics' (inflightprom, under
// the cap the refusal names), and the OpenTelemetry adapter's.
func (g *Gateway) providerRefused(ctx context.Context, model string, err error) {
	g.prom.Trace(model).Refused(err)
	if g.tel != nil {
		// nil when the Cap would record nothing (no recording span, its
		// instruments disabled).
		if tr := g.tel.provider.Trace(ctx); tr != nil {
			tr.Refused(err)
		}
	}
}

// reject answers an admission error, names capName in the request's
// access line and logs it (rate-limited). The client gone while waiting is
// not a rejection: nothing is written to nobody.
func (g *Gateway) reject(w http.ResponseWriter, r *http.Request, capName, model string, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return
	}
	requestInfoFrom(r.Context()).refusedBy = capName
	status, _, msg := admissionAnswer(err)
	writeAdmissionError(w, capName, err)
	org := cmp.Or(r.Header.Get(OrgHeader), "default") // as model caps it
	if g.orgRejections != nil {
		g.orgRejections.WithLabelValues(org, capName, rejectReason(err)).Inc()
	}
	if ok, suppressed := g.rejections.allow(time.Now()); ok {
		g.log.Warn("gateway: request rejected", slog.String("cap", capName), slog.Int("status", status),
			slog.String("reason", rejectReason(err)), slog.String("org", org),
			slog.String("model", model), slog.String("detail", msg), slog.Int("suppressed_since_last", suppressed))
	}
}

// logLimitChanges logs each change of the provider's learned caps at info
// level, with the evidence behind it: a line per move of a cap, none while
// the caps hold.
func (g *Gateway) logLimitChanges() {
	g.gate.OnLimitChange(func(c pacing.LimitChange) {
		g.log.Info("gateway: learned cap changed", slog.Uint64("seq", c.Seq), slog.String("provider", c.Provider),
			slog.String("model", c.Model), slog.String("api_key", c.Key),
			slog.Int("old", c.OldCap), slog.Int("new", c.Cap), slog.Int("old_ceiling", c.OldCeiling), slog.Int("ceiling", c.Ceiling),
			slog.String("evidence", c.Evidence.Kind.String()), slog.Int("in_flight_at_start", c.Evidence.InFlight))
	})
}

// refusedBy names the provider's cap that refused a request with err:
// as the Gate names it (pacing.CapProvider, CapModel, CapAPIKey,
// CapPacing, CapPause), the fleet's pause (fleet.CapPaused), or the
// fleet's key ("provider", "model:<name>");
// a wait that ended otherwise (the client left, the fleet's store
// unreachable) is the provider's.
func refusedBy(err error) string {
	var le *slots.LimitError
	if !errors.As(err, &le) {
		return pacing.CapProvider
	}
	switch {
	case le.Cap != "":
		return le.Cap
	case strings.HasPrefix(le.Key, "model:"):
		return pacing.CapModel
	}
	return pacing.CapProvider
}

// rejectReason names an admission error as the metrics do
// (inflightprom.RejectReason), the fleet's store unavailable as
// "unavailable".
func rejectReason(err error) string {
	if errors.Is(err, fleet.ErrUnavailable) {
		return "unavailable"
	}
	return inflightprom.RejectReason(err)
}
