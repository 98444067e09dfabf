package upstream

import (
	"io"
	"net/http"
	"sync/atomic"

	"github.com/inflight-go/inflight/pacing/pacingtest"
)

// Hidden serves a pacingtest.Upstream over HTTP: a provider whose
// concurrency cap is hidden and follows a schedule, and that answers 429
// (code 1302, with Retry-After) over it. A request's X-Service-Time header
// (pacingtest.ServiceHeader) says how long its answer streams; a complete
// answer ends with "data: [DONE]".
//
// It counts the requests open at it, the refused ones too, from their
// arrival until their answer has been written and before the client can
// see its end: the load the account sees, counted by the provider rather
// than by whoever limits it. Create it with NewHidden; the Upstream's
// fields must be set, and Start called, before it serves.
type Hidden struct {
	U    *pacingtest.Upstream
	open atomic.Int64
	peak atomic.Int64
}

// NewHidden returns u served over HTTP.
func NewHidden(u *pacingtest.Upstream) *Hidden { return &Hidden{U: u} }

// Open returns how many requests are open at the provider now.
func (h *Hidden) Open() int { return int(h.open.Load()) }

// Peak returns the most requests open at once since the last ResetPeak
// (or since the start).
func (h *Hidden) Peak() int { return int(h.peak.Load()) }

// ResetPeak starts the peak afresh from the requests open now.
func (h *Hidden) ResetPeak() { h.peak.Store(h.open.Load()) }

func (h *Hidden) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.open.Add(1)
	raise(&h.peak, n)
	closed := false
	done := func() {
		if !closed {
			closed = true
			h.open.Add(-1)
		}
	}
	defer done()
	resp, err := h.U.RoundTrip(r) // it closes the request's body, and waits on its context
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		done() // the answer is whole here: the client may see it at once
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		return
	}
	w.WriteHeader(resp.StatusCode)
	w.(http.Flusher).Flush()
	// The stream carries no tokens: it ends after the request's service
	// time, or with an error when the client goes away first.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return
	}
	done()
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}
