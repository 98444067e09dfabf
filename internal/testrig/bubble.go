package testrig

import (
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
)

// Bubble is synctest.Test, on one P when the race detector is on.
//
// Go 1.26's race runtime corrupts its own state (a ThreadSanitizer CHECK
// failure, or a SIGSEGV in runtime.(*timer).modify) when two goroutines of
// one bubble start, at the same moment on two threads, timers that are due
// at once: each runs its timer on the spot under the bubble's one race
// context (runtime.(*timer).unlockAndRun; golang/go#78156). Code under test
// does that often: httputil.ReverseProxy starts time.AfterFunc(-1) for each
// streamed answer, and a Gate's or a learner's wake-up may be due now. On
// one P no two goroutines run at once, so the race context is never shared;
// the goroutines still interleave, by preemption, and time is still the
// bubble's. Without the race detector it is synctest.Test itself.
func Bubble(t *testing.T, f func(*testing.T)) {
	t.Helper()
	if raceEnabled {
		onOneP()
		defer offOneP()
	}
	synctest.Test(t, f)
}

// oneP counts the bubbles running on one P: the first sets GOMAXPROCS to 1,
// the last puts back what it was, so that parallel tests cannot leave it at
// 1 or lift it under a bubble still running.
var oneP struct {
	sync.Mutex
	n    int
	prev int
}

func onOneP() {
	oneP.Lock()
	defer oneP.Unlock()
	if oneP.n == 0 {
		oneP.prev = runtime.GOMAXPROCS(1)
	}
	oneP.n++
}

func offOneP() {
	oneP.Lock()
	defer oneP.Unlock()
	oneP.n--
	if oneP.n == 0 {
		runtime.GOMAXPROCS(oneP.prev)
	}
}
