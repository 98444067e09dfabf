package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// The conformance suite on a standalone redis-server (with its faults), on
// a Cluster of three masters, and through a Sentinel.
func TestConformance(t *testing.T) {
	fleettest.Run(t, func(t *testing.T) fleettest.Server { return standalone{redistest.Start(t)} })
}

// patient is the read and write timeout of the stores' clients in the
// suite: its longest bound on a store's call (fleet.WithTimeout of 10 s,
// in the tests that count the store's errors and assert the cap with
// every admission made by the store). A client's timeouts must be no
// shorter than the fleet's (see the package documentation): with 250 ms,
// go-redis ended each read after 250 ms whatever the call's deadline, and
// on two busy cores a reply took longer now and then: the call failed,
// the breaker opened, and the local fallback admitted past the fleet's
// cap (LargeAmongSmall: "i/o timeout", a peak of 1,500,000 tokens of
// 1,000,000). ContextTimeoutEnabled stays on: each call still ends at the
// deadline the fleet gives it (500 ms by default), so a standalone
// server's faults (a kill, a SIGSTOP) are felt as soon.
const patient = 10 * time.Second

func TestConformanceCluster(t *testing.T) {
	fleettest.Run(t, func(t *testing.T) fleettest.Server {
		return shared{redistest.StartCluster(t, 3).PatientClient(patient)}
	})
}

func TestConformanceSentinel(t *testing.T) {
	fleettest.Run(t, func(t *testing.T) fleettest.Server {
		return shared{redistest.StartSentinel(t).PatientClient(patient)}
	})
}

// queued counts the tickets in the fleet's queue of key on c.
func queued(c redis.UniversalClient, fleet, key string) (int, error) {
	n, err := c.ZCard(context.Background(), redisstore.KeyOf(redisstore.New(c, fleet), key)+"#q").Result()
	return int(n), err
}

// standalone is one redis-server without persistence: Kill and Restart
// lose its data, as Lose does.
type standalone struct{ *redistest.Server }

func (s standalone) Store(t testing.TB, fleet string) driver.Store {
	return redisstore.New(s.PatientClientFor(t, patient), fleet)
}

func (s standalone) Address() string { return s.Addr }

func (s standalone) StoreVia(t testing.TB, fleet, addr string) driver.Store {
	return redisstore.New(redistest.ClientAt(t, addr), fleet)
}

func (s standalone) Queued(fleet, key string) (int, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	return queued(c, fleet, key)
}

func (s standalone) Lose() {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		panic(err)
	}
}

// shared is a Cluster or a Sentinel's master, through one client that
// every process of the suite shares (each its own Store).
type shared struct{ c redis.UniversalClient }

func (s shared) Store(_ testing.TB, fleet string) driver.Store { return redisstore.New(s.c, fleet) }

func (s shared) Queued(fleet, key string) (int, error) { return queued(s.c, fleet, key) }

// The grants of a serving that goes on past its look bound (a release of
// several pairs on a key) pass the waiters before where it goes on, as
// grants from the head do: they count towards MaxPassed.
func TestUrgentPastTheLookBound(t *testing.T) {
	fleettest.UrgentPastTheLookBound(t, standalone{redistest.Start(t)}.Store(t, "f"))
}
