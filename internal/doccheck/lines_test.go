package doccheck_test

import (
	"bytes"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// admissionFiles are the files of the admission code: the engine, the
// Limiter and its Slot, the Registry without the fleet, and the Gate's
// admission (its grants, lanes, dispatch, status and refusals). The HTTP seams of
// package slots and the Gate's pacing, learning and budgets are apart.
var admissionFiles = []string{
	"internal/core/*.go",
	"slots/slots.go", "slots/limiter.go", "slots/options.go", "slots/priority.go",
	"slots/combine.go", "slots/events.go",
	"registry/*.go",
	"pacing/gate.go", "pacing/lanes.go", "pacing/dispatch.go", "pacing/status.go", "pacing/refusal.go",
}

// maxAdmissionLines and maxAdmissionCode are what the admission code may
// not grow past: its lines, and its lines of code (neither blank nor a
// comment alone). Lower them when it shrinks; say in the commit why when
// they must rise. The goal is 4,000 lines, of 4,937 when it was
// written; the restatement proposed is 4,000 lines of code. From its
// split out of gate.go until this count, pacing/refusal.go (which cap
// refused a Gate's caller, and its Retry-After) was left out of the
// list, and the count it gave, 3,994 lines of code at the last, was
// short: with it, 4,130 lines of code, 6,045 in all. Since, 42 for a
// LimitFunc's fetch that its waiters can count on (a fetch ended with its
// caller's context fetched again, its outcome kept with the fetch, the
// limit it resolved carried to the lanes made after it, a first fetch
// waited for under an override too), and 1 for a lane's returns told
// weighed by those told elsewhere (core.Told.Elsewhere, a fleet's).
// Then 44 fewer: one report of a queue (core.QueueStats, three copies
// before), one ending of a registry release, one of Await, tables for
// the priorities' names, and smaller cuts. Then 8 for ClockOption: one
// clock option for every owner, a Transport and pacing's own budgets.
// Then 29 for a Retry-After told to a caller whose deadline passed as it
// waited (core.OutDeadline, on every owner), and 60 fewer: in registry,
// one walk of the shards, applyLimit's locks taken as an acquire's are,
// passed-over waiters counted where a multi-key grant is held, wrappers
// that only forwarded (34); in slots and pacing, a Gate's queue entered
// and left in one place, one key picker, a start's key taken once, a
// refusal's Retry-After that takes the later of its budget's time and the
// next starts, the priorities parsed from the table of their names (26).
// Then 1 for core.RetryLater (a fleet's deadline), and 29 fewer in core:
// Begin with leak detection written in one place, the flow bound
// compared where it is used, a bypassed hold's owner embedded, stdlib
// helpers for a filter and two class scans, and smaller cuts. Then 1 for
// a shard's lock released when RefreshLimits' match panics. Then 44
// fewer: one-caller helpers folded in (core's bypassHold, registry's
// newMulti, pacing's modelLocked), stdlib helpers for a class scan and
// the prune of cached limits, a registry wait's cancel and deadline
// counted in one case, and boolean expressions, composite literals and
// an if/else where several statements said the same. Then 47 fewer,
// which brings it under the restated goal: one-caller helpers folded in
// (core's packageOf, roundMs, quantum and newFlow, the Limiter's
// refusalLocked, registry's lockBesideAll and entriesLocked, pacing's
// capBindingLocked), a hold time's first sample folded into the
// estimate as the others, a key's release ended in one place, a lookup
// that only forwarded, a bit set that no probe read, the engine set in
// the Registry's composite literal, and a fetched limit's condition to
// apply in one boolean expression. Then 10 for a panic recovered on a
// goroutine of the library's own logged to its slot's logger (Owner.Log),
// not slog's default, and not again to a logger that panicked. Then 5
// for a reclaim that calls its Tracked's First (a Transport ends the
// exchange of a response dropped with its Slot), and 4 fewer: a holder's
// extra units added and taken without a test for 0. Then 2 for a reclaim
// that frees the hold also when First panics, and 2 fewer in a lane's
// Remove. Then 1 for registry's ErrInvalidKey declared in core, so that
// slots.HTTPStatus answers it 400 (the client's key, too long), not 500:
// 4,000 lines of code, the restated goal. Then 1 for a LimitFunc's cache
// pruned at most once a second (a 1 ms refresh walked the live keys on
// every acquire), and 2 fewer: the shards' caches made with the registry.
// Then 1 fewer: a reclaim's First is handed the rest of the reclaim (a
// Transport frees a reclaimed exchange's slot after its linger). Then 1
// for a shard's count of its keys' limit fetches: a fetch recorded before
// its key's record was pruned no longer passes for one recorded after
// (each record counted from zero), 3,999 lines of code. Then 2 for a
// budget's refusal told as what started in its last minute, not "in
// flight" (LimitError.Error), and 2 fewer: a LimitError's key and cap
// told in two statements, WithFlow on one line.
const (
	maxAdmissionLines = 5960
	maxAdmissionCode  = 3999
)

// TestAdmissionCodeSize counts the lines of the admission code's non-test
// files (go test -v -run AdmissionCodeSize ./internal/doccheck prints it),
// and of them those of code (a token on them, not a comment alone), and
// keeps both from growing.
func TestAdmissionCodeSize(t *testing.T) {
	root := filepath.Join("..", "..")
	total, code := 0, 0
	for _, pattern := range admissionFiles {
		files, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s matches no file (%v)", pattern, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			total += bytes.Count(b, []byte("\n"))
			code += codeLines(t, b)
		}
	}
	t.Logf("admission code: %d lines, %d of them code, neither blank nor a comment (goal 4,000)", total, code)
	if total > maxAdmissionLines {
		t.Errorf("the admission code is %d lines, more than %d", total, maxAdmissionLines)
	}
	if code > maxAdmissionCode {
		t.Errorf("the admission code has %d lines of code, more than %d", code, maxAdmissionCode)
	}
}

// codeLines counts the lines of src on which a token other than a
// comment starts or goes on (a raw string's lines count whole).
func codeLines(t *testing.T, src []byte) int {
	fset := token.NewFileSet()
	f := fset.AddFile("", fset.Base(), len(src))
	var s scanner.Scanner
	s.Init(f, src, func(pos token.Position, msg string) { t.Fatalf("%v: %s", pos, msg) }, 0)
	lines := map[int]bool{}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return len(lines)
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue // inserted at a line's end
		}
		first := f.Line(pos)
		for l := first; l <= first+strings.Count(lit, "\n"); l++ {
			lines[l] = true
		}
	}
}
