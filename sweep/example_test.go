package sweep_test

import (
	"fmt"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
)

func ExampleMonitor_Sweep() {
	mock := clock.NewMock()
	reg := registry.New[string](64, slots.WithClock(mock))
	m := sweep.New(reg, sweep.WithClock(mock), sweep.WithThreshold(30*time.Minute), sweep.WithInterval(time.Hour))
	defer m.Stop()

	stream, _ := reg.TryAcquire("org-a/glm-5") // a stream that never ends
	short, _ := reg.TryAcquire("org-b/glm-4")
	short.Release()

	mock.Add(31 * time.Minute)
	rep := m.Sweep(mock.Now())
	fmt.Println("in use:", rep.InUse, "busiest:", rep.BusiestKey)
	for _, h := range rep.NewlyLongHeld {
		fmt.Println("held too long:", h.Key, h.HeldFor)
	}
	rep = m.Sweep(mock.Now().Add(time.Minute))
	fmt.Println("reported again:", len(rep.NewlyLongHeld))
	stream.Release()
	// Output:
	// in use: 1 busiest: org-a/glm-5
	// held too long: org-a/glm-5 31m0s
	// reported again: 0
}
