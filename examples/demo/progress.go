package main

import (
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/examples/internal/upstream"
)

// progress shows how a run is going while it runs: on a terminal one line
// that updates five times a second, elsewhere a line a second.
type progress struct {
	w        io.Writer
	terminal bool
	every    time.Duration
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, every: time.Second}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal, p.every = true, 200*time.Millisecond
		}
	}
	return p
}

// start shows the run called name until the returned function is called,
// which prints its last state.
func (p *progress) start(name string, total int, done *atomic.Int64, prov *upstream.Provider) (stop func()) {
	return p.startWith(name, total, done, func() string {
		c := prov.Counts()
		return fmt.Sprintf("%2d open at the provider now, %3d upstream 429s so far", c.InFlight, c.Refused)
	})
}

// startWith is start with the providers' state told by state.
func (p *progress) startWith(name string, total int, done *atomic.Int64, state func() string) (stop func()) {
	if p == nil || p.w == nil || p.w == io.Discard {
		return func() {}
	}
	began := time.Now()
	line := func() string {
		return fmt.Sprintf("%-20s %3d of %d requests ended (completed or failed), %s, %5.1fs", name, done.Load(), total, state(), time.Since(began).Seconds())
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(p.every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				if p.terminal {
					fmt.Fprintf(p.w, "\r%s\n", line())
				} else {
					fmt.Fprintln(p.w, line())
				}
				return
			case <-t.C:
				if p.terminal {
					fmt.Fprintf(p.w, "\r%s", line())
				} else {
					fmt.Fprintln(p.w, line())
				}
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}
