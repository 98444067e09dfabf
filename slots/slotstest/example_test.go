package slotstest_test

import (
	"fmt"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// printingTB stands in for a *testing.T in this example.
type printingTB struct{}

func (printingTB) Helper()                           {}
func (printingTB) Errorf(format string, args ...any) { fmt.Println("FAIL") }

func ExampleVerifyRegistry() {
	reg := registry.New[string](8)
	s, _ := reg.TryAcquire("org-a")
	s.Release()
	slotstest.VerifyRegistry(printingTB{}, reg) // in a test: defer slotstest.VerifyRegistry(t, reg)
	fmt.Println("nothing left held")
	// Output: nothing left held
}
