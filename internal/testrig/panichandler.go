package testrig

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
)

// PanicHandler is a slog.Handler that panics on a record whose message
// contains Match, while Armed is set (nil: always), and then sets Fired
// (if not nil): a log sink that fails by panicking.
type PanicHandler struct {
	Match        string
	Armed, Fired *atomic.Bool
}

func (h PanicHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h PanicHandler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, h.Match) && (h.Armed == nil || h.Armed.Load()) {
		if h.Fired != nil {
			h.Fired.Store(true)
		}
		panic("log handler panics")
	}
	return nil
}

func (h PanicHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h PanicHandler) WithGroup(string) slog.Handler      { return h }
