package pacing_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// The fleet hands its refusal to its Observer (Event.Err) before it
// returns it, and an Observer may pass the error on (to a logging
// goroutine, a channel): the Transport names a copy of it, the caller's,
// and writes nothing the Observer reads. It used to set the refusal's Cap
// in place, a data race under -race.
func TestTransportNamesACopyOfTheFleetsRefusal(t *testing.T) {
	seen := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for err := range seen {
			var le *slots.LimitError
			if errors.As(err, &le) {
				_ = le.Cap // a log line's "cap" attribute
			}
		}
	})
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventRejected && e.Err != nil {
			seen <- e.Err
		}
	})
	caps := fleet.New[string](memstore.New(), 1, fleet.WithObserver(obs), fleet.WithLocalOptions(slots.WithMaxWait(50*time.Millisecond)))
	t.Cleanup(caps.Close)
	held, err := caps.TryAcquire("provider")
	require.NoError(t, err)
	defer held.Release()

	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 4})
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(caps))
	_, err = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	var le *slots.LimitError
	require.True(t, errors.As(err, &le), "%v", err)
	require.Equal(t, pacing.CapProvider, le.Cap, "the caller is told the cap")
	close(seen)
	wg.Wait()
}
