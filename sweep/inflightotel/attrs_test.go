package inflightotel_test

import (
	"context"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// A refusal told without its error (an Event a program builds itself, as
// the example gateway does) is counted as other and put on the trace as
// an error, as the metrics count it. Before, the span's status read the
// nil error's text: Observe panicked on the admission's path.
func TestRefusalWithoutError(t *testing.T) {
	sr, tp := tracing(t)
	m := newMeters(t)
	c, err := inflightotel.New("x", inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	ctx, span := tp.Tracer("t").Start(context.Background(), "req")
	defer span.End()
	require.NotPanics(t, func() { c.Observe(slots.Event{Kind: slots.EventRejected, Context: ctx}) })
	assert.Equal(t, map[string]int64{"inflight.cap=x,inflight.priority=default,inflight.result=other": 1},
		ints(t, m.collect(t)["inflight.requests"]))
	ended := sr.Ended()
	require.Len(t, ended, 1)
	assert.Equal(t, codes.Error, ended[0].Status().Code)
}

// Every attribute and status a Cap exports is UTF-8, whatever the flow, the
// cap's name or a refusal's error says: OTLP's protobuf refuses a string
// that is not, and with it every span or point exported in the same
// request (the OTLP export itself is shown in the example gateway's
// TestOTLPExportOfAFlowNotUTF8). Before, they went out as they came.
func TestAttributesAreUTF8(t *testing.T) {
	sr, tp := tracing(t)
	m := newMeters(t)
	c, err := inflightotel.New("cap-\xff", inflightotel.WithMeterProvider(m), inflightotel.WithFlowAttribute())
	require.NoError(t, err)
	ctx, span := tp.Tracer("t").Start(context.Background(), "req")
	ctx = slots.WithFlow(ctx, "org-\xfe\xff")
	c.Observe(slots.Event{Kind: slots.EventAcquired, Context: ctx})
	c.Observe(slots.Event{Kind: slots.EventRejected, Err: errors.New("refused \xff"), Context: ctx})
	span.End()

	for _, s := range sr.Ended() {
		assert.True(t, utf8.ValidString(s.Name()), "span name %q", s.Name())
		assert.True(t, utf8.ValidString(s.Status().Description), "status %q", s.Status().Description)
		for _, kv := range s.Attributes() {
			assert.True(t, utf8.ValidString(kv.Value.AsString()), "span attribute %s=%q", kv.Key, kv.Value.AsString())
		}
	}
	points := ints(t, m.collect(t)["inflight.requests"])
	require.Len(t, points, 2)
	for series := range points {
		assert.True(t, utf8.ValidString(series), "series %q", series)
	}
}

// learnedFunc is a Learner of its own.
type learnedFunc func() pacing.Learned

func (f learnedFunc) Learned() pacing.Learned { return f() }

// LearnedCaps' attributes are UTF-8 too, whatever the provider's, a
// model's or a key's name (a Learner of the program's own may name them
// with any bytes).
func TestLearnedCapsAttributesAreUTF8(t *testing.T) {
	m := newMeters(t)
	capOf := pacing.Learned{Enabled: true, Limit: 2, Cap: 2, Ceiling: 4, Floor: 1, Max: 4}
	lc, err := inflightotel.NewLearnedCaps("zai-\xff", learnedFunc(func() pacing.Learned {
		return pacing.Learned{Enabled: true,
			Models: map[string]pacing.Learned{"glm-\xfe": capOf},
			Keys:   map[string]pacing.Learned{"key-\xfd": capOf}}
	}), inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	defer lc.Close()
	got := m.collect(t)
	require.NotEmpty(t, got)
	for name, a := range got {
		for series := range ints(t, a) {
			assert.True(t, utf8.ValidString(series), "%s: series %q", name, series)
		}
	}
}
