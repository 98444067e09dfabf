package redistest

import (
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Mini is a miniredis (an in-process Redis that runs Lua) whose clock the
// test sets: what TIME returns to the scripts. For tests of the scripts,
// or of a fleet, on a clock of their own.
type Mini struct {
	Srv *miniredis.Miniredis
	Now time.Time // the server's clock
	t   testing.TB
}

// StartMini starts a Mini, its clock at a fixed time, stopped at the
// test's cleanup.
func StartMini(t testing.TB) *Mini {
	m := &Mini{Srv: miniredis.RunT(t), Now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), t: t}
	m.Srv.SetTime(m.Now)
	return m
}

// Advance moves the server's clock on by d.
func (m *Mini) Advance(d time.Duration) {
	m.Now = m.Now.Add(d)
	m.Srv.SetTime(m.Now)
}

// Client returns a client of the server (5 s timeouts, no retries),
// closed at the test's cleanup. An in-process server never hangs, but its
// scripts run in a Lua interpreter in Go: under the race detector, on two
// busy cores, one took more than the 200 ms the client was given before
// (TestQueueKeysExpireUnderStress: "i/o timeout").
func (m *Mini) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: m.Srv.Addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, MaxRetries: -1})
	m.t.Cleanup(func() { c.Close() })
	return c
}

// Leases returns the leases on key of the fleet named fleet (under the
// default prefix): a key without '#' that does not start "abandoned:"
// (the store keeps those under a name of their own). The key may go at any moment (a background release
// removes its last lease), so a missing key is no lease, not an error:
// asking first whether it exists would race.
func (m *Mini) Leases(fleet, key string) []string {
	members, err := m.Srv.ZMembers("inflight:{" + fleet + "}:" + key)
	if errors.Is(err, miniredis.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		m.t.Fatalf("redistest: %v", err)
	}
	return members
}
