package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inflight-go/inflight/examples/internal/gateway"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// fleetFlag is -fleet: off (""), "redis" (-fleet alone) or "postgres".
type fleetFlag string

func (f *fleetFlag) String() string   { return string(*f) }
func (f *fleetFlag) IsBoolFlag() bool { return true }

func (f *fleetFlag) Set(v string) error {
	switch v {
	case "true", "redis":
		*f = "redis"
	case "false":
		*f = ""
	case "postgres":
		*f = "postgres"
	default:
		return fmt.Errorf(`-fleet: "redis" or "postgres", not %q`, v)
	}
	return nil
}

// fleetStore is the store the fleet's runs share, started by the demo:
// the moving cap's run and the three gateways' each have a database of
// their own on it.
type fleetStore struct {
	label, server  string // "Redis", "a redis-server"
	moving, shared *gateway.FleetConfig
}

// startStore starts the store kind names, and returns it with a stop
// function.
func startStore(kind string) (*fleetStore, func(), error) {
	if kind == "postgres" {
		return startPostgres()
	}
	addr, stop, err := startRedis()
	if err != nil {
		return nil, nil, err
	}
	return &fleetStore{label: "Redis", server: "a redis-server",
		moving: &gateway.FleetConfig{RedisURL: "redis://" + addr + "/1"},
		shared: &gateway.FleetConfig{RedisURL: "redis://" + addr + "/0"}}, stop, nil
}

// startPostgres makes a PostgreSQL cluster in a temporary directory and
// starts its server on a free loopback port (see pgtest.Launch), with a
// second database for the moving cap's run.
func startPostgres() (*fleetStore, func(), error) {
	srv, err := pgtest.Launch()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.URL)
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE DATABASE moving")
		_ = conn.Close(ctx)
	}
	if err != nil {
		srv.Close()
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	u, _ := url.Parse(srv.URL) // made by pgtest
	u.Path = "/moving"
	return &fleetStore{label: "PostgreSQL", server: "a PostgreSQL server",
		moving: &gateway.FleetConfig{PostgresURL: u.String()},
		shared: &gateway.FleetConfig{PostgresURL: srv.URL}}, srv.Close, nil
}

// untilSignal returns stop, safe to call more than once, and calls it
// itself and ends the process if SIGINT or SIGTERM comes first: a signal
// ends the demo without its deferred calls, and the store's server would
// outlive it, PostgreSQL's cluster in its temporary directory too.
func untilSignal(stop func()) func() {
	once := sync.OnceFunc(stop)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			once()
			os.Exit(128 + int(s.(syscall.Signal))) // the shell's code for a process a signal ended
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
		once()
	}
}

// startRedis runs a redis-server on a free loopback port, without
// persistence, and returns its address and a stop function.
func startRedis() (string, func(), error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("no redis-server binary (apt-get install redis-server)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "inflight-demo-redis")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server at %s not answering: %w", addr, err)
		}
		time.Sleep(5 * time.Millisecond) // a process starting: poll its port
	}
}
