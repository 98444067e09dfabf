package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
)

// Every process of the fleet "gateway" runs this: a cap of 8 requests in
// flight to the provider, across all of them, on their Redis. (Compiled,
// not run: it needs a server.)
func Example() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  "redis.internal:6379",
		DialTimeout:           250 * time.Millisecond,
		ReadTimeout:           500 * time.Millisecond, // no shorter than fleet.WithTimeout
		WriteTimeout:          500 * time.Millisecond,
		ContextTimeoutEnabled: true,
		MaxRetries:            1,
		Protocol:              2,
	})
	defer rdb.Close()
	caps := fleet.New[string](redisstore.New(rdb, "gateway"), 8)
	defer caps.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slot, err := caps.Acquire(ctx, "provider")
	if err != nil {
		log.Print(err) // *slots.LimitError, the context's error, or fleet.ErrUnavailable
		return
	}
	defer slot.Release()
	fmt.Println("calling the provider")
}
