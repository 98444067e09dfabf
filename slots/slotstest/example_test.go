package slotstest_test

import (
	"errors"
	"fmt"

	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// printingTB stands in for a *testing.T in this example.
type printingTB struct{}

func (printingTB) Helper()                           {}
func (printingTB) Errorf(format string, args ...any) { fmt.Println("FAIL") }

func ExampleVerifyLimiter() {
	lim := slots.NewLimiter(8)
	s, _ := lim.TryAcquire()
	s.Release()
	slotstest.VerifyLimiter(printingTB{}, lim) // in a test: defer slotstest.VerifyLimiter(t, lim)
	fmt.Println("nothing left held")
	// Output: nothing left held
}

func ExampleRecorder() {
	var events slotstest.Recorder
	lim := slots.NewLimiter(1, slots.WithObserver(&events))
	s, _ := lim.TryAcquire()
	_, _ = lim.TryAcquire() // refused: the slot is held
	s.Release()
	fmt.Println(events.Kinds()[0] == slots.EventAcquired, errors.Is(events.Events()[1].Err, slots.ErrLimitReached), len(events.Kinds()))
	// Output: true true 3
}
