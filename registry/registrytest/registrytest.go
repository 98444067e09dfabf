// Package registrytest checks, at the end of a test, that a Registry is left
// tracking no key: no holder and no waiter on any.
//
//	func TestProxy(t *testing.T) {
//		reg := registry.New[string](8)
//		defer registrytest.Verify(t, reg)
//		...
//	}
//
// As slotstest's checks do, it retries for up to slotstest.Patience, for a
// release still on its way when the test body returns.
package registrytest

import (
	"fmt"
	"strings"
	"time"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// Verify fails t, listing what remains, unless r tracks no key (within
// slotstest.Patience).
func Verify[K comparable](t slotstest.TB, r *registry.Registry[K]) {
	t.Helper()
	slotstest.Eventually(t, func() string {
		st := r.Stats()
		if st.Keys == 0 {
			return ""
		}
		var b strings.Builder
		fmt.Fprintf(&b, "registrytest: registry tracks %d keys: %d held, %d waiting", st.Keys, st.InFlight, st.Waiting)
		now := time.Now()
		for _, h := range r.Holders(nil) {
			fmt.Fprintf(&b, "\n\tkey %v: slot %d held for %v", h.Key, h.ID, now.Sub(h.AcquiredAt).Round(time.Millisecond))
		}
		return b.String()
	})
}
