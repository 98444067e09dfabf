package testrig

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
)

// SettingClock is a mock clock that tells each AfterFunc and Timer once it
// is registered, by its duration: a test that advances the mock must know
// that the timer it means to fire exists, where it is set at a moment the
// test cannot see (a waiter's once it is queued, a reclaim's linger on the
// runtime's cleanup goroutine). Moved a step at a time instead, the clock
// goes on while a slow goroutine has not set its timer yet, or has not
// read the clock since it fired.
type SettingClock struct {
	*clock.Mock
	set chan time.Duration
}

// NewSettingClock returns a SettingClock at the mock's start.
func NewSettingClock() *SettingClock {
	return &SettingClock{Mock: clock.NewMock(), set: make(chan time.Duration, 64)}
}

func (c *SettingClock) AfterFunc(d time.Duration, f func()) *clock.Timer {
	t := c.Mock.AfterFunc(d, f)
	c.tell(d)
	return t
}

func (c *SettingClock) Timer(d time.Duration) *clock.Timer {
	t := c.Mock.Timer(d)
	c.tell(d)
	return t
}

func (c *SettingClock) tell(d time.Duration) {
	select {
	case c.set <- d:
	default: // more timers than a test waits for: never block the caller
	}
}

// Set returns the durations of the timers registered and not yet read
// (by WaitSet or from Set): a test may look there for none.
func (c *SettingClock) Set() <-chan time.Duration { return c.set }

// WaitSet waits, up to 10 s, for n AfterFuncs or Timers of d to be
// registered (others are skipped), and fails the test else.
func (c *SettingClock) WaitSet(t testing.TB, n int, d time.Duration) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for n > 0 {
		select {
		case got := <-c.set:
			if got == d {
				n--
			}
		case <-deadline:
			t.Fatalf("%d more timers of %v were never set", n, d)
		}
	}
}
