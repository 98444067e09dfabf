package testrig

import (
	"testing"
	"time"
)

// WarmHolds makes sixteen holds of d, one after another, each admitted by
// acquire: the warm-up of an owner's hold-time estimate, which every
// release feeds until then, so that its Retry-After goes by a mean hold of
// d. Use it inside a testing/synctest bubble.
func WarmHolds[S Releaser](t testing.TB, d time.Duration, acquire func() (S, error)) {
	t.Helper()
	for range 16 {
		s, err := acquire()
		if err != nil {
			t.Fatalf("a warm-up hold: %v", err)
		}
		time.Sleep(d)
		s.Release()
	}
}
