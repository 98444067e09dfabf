package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
)

// Every process of the fleet "gateway" runs this: a cap of 8 requests in
// flight to the provider, across all of them, on their PostgreSQL
// database. (Compiled, not run: it needs a database.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://gateway@db.internal/gateway")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(ctx, pool, "gateway") // makes the tables once, safely from every replica at once
	if err != nil {
		log.Fatal(err)
	}
	caps := fleet.New[string](store, 8)
	defer caps.Close()

	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	slot, err := caps.Acquire(ctx, "provider")
	if err != nil {
		log.Print(err) // *slots.LimitError, the context's error, or fleet.ErrUnavailable
		return
	}
	defer slot.Release()
	fmt.Println("calling the provider")
}

// Behind PgBouncer in transaction mode: the pool goes through PgBouncer
// with its statements unprepared (pgx's statement cache is session
// state), and the one connection that listens for wake-ups goes straight
// to the database (LISTEN is session state too). (Compiled, not run.)
func ExampleWithListenConfig() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://gateway@pgbouncer.internal:6432/gateway?default_query_exec_mode=exec")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	direct, err := pgx.ParseConfig("postgres://gateway@db.internal:5432/gateway")
	if err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(ctx, pool, "gateway", pgstore.WithListenConfig(direct))
	if err != nil {
		log.Fatal(err)
	}
	caps := fleet.New[string](store, 8)
	defer caps.Close()
}
