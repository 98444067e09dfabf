package testrig

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// DeadlineRetries starts n callers together, each running acquire under a
// context whose deadline passes after deadline, and returns, in order,
// the RetryAfter() that each one's error carries: a caller whose deadline
// passed as it waited is told when its turn was expected. It fails t for
// a caller that was admitted, or whose error is not the context's or
// carries no RetryAfter (told 0). Use it inside a testing/synctest bubble.
func DeadlineRetries(t testing.TB, n int, deadline time.Duration, acquire func(context.Context) error) []time.Duration {
	t.Helper()
	told := make(chan time.Duration, n)
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			err := acquire(ctx)
			var later interface{ RetryAfter() time.Duration }
			switch {
			case !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("a caller's deadline passed, and it was told %v", err)
			case !errors.As(err, &later):
				t.Errorf("no RetryAfter with %v", err)
			default:
				told <- later.RetryAfter()
				return
			}
			told <- 0
		}()
	}
	got := make([]time.Duration, 0, n)
	for range n {
		got = append(got, <-told)
	}
	slices.Sort(got)
	return got
}
