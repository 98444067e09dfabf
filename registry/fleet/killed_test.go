package fleet

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// A holder process killed with SIGKILL mid-hold: nothing releases its
// leases, so the cap stays taken until they expire (one TTL), then this
// process gets it; Redis never counts more than the cap meanwhile.
func TestKilledHolderProcess(t *testing.T) {
	if os.Getenv("FLEET_KILLED_CHILD") != "" {
		t.Skip("in a child process")
	}
	srv := redistest.Start(t)
	const ttl = 300 * time.Millisecond
	live := New[string](redisstore.New(srv.Client(), "killed"), 2, WithLeaseTTL(ttl))
	defer live.Close()
	ctx := context.Background()

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledHolderChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FLEET_KILLED_CHILD=1", "FLEET_REDIS="+srv.Addr)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	held := make(chan struct{})
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "held" {
				close(held)
			}
		}
		exited <- cmd.Wait()
	}()
	select {
	case <-held:
	case err := <-exited:
		t.Fatalf("the child exited before it held the cap: %v", err)
	case <-time.After(30 * time.Second): // a bound on a hang
		t.Fatal("the child never held the cap")
	}
	n, err := live.InFlight(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 2, n, "the child holds the cap")
	_, err = live.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached)

	require.NoError(t, cmd.Process.Kill()) // SIGKILL: no release, no renewal
	killed := time.Now()
	<-exited

	// Watch Redis's count while this process waits for the cap.
	over := make(chan int, 1)
	watching, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watching.Err() == nil {
			if n, err := live.InFlight(watching, "k"); err == nil && n > 2 {
				over <- n
				return
			}
		}
	}()
	var got []*slots.Slot
	for range 2 {
		s, err := live.Acquire(ctx, "k")
		require.NoError(t, err)
		got = append(got, s)
	}
	waited := time.Since(killed)
	stopWatch()
	<-watched
	select {
	case n := <-over:
		t.Errorf("Redis counted %d for the cap of 2", n)
	default:
	}
	assert.GreaterOrEqual(t, waited, ttl/2, "the dead holder's leases held the cap until they expired")
	n, err = live.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "only this process's two leases")
	for _, s := range got {
		s.Release()
	}
}

// TestKilledHolderChild is the holder process of TestKilledHolderProcess:
// it holds the cap of 2 and waits to be killed.
func TestKilledHolderChild(t *testing.T) {
	if os.Getenv("FLEET_KILLED_CHILD") == "" {
		t.Skip("run by TestKilledHolderProcess")
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("FLEET_REDIS")})
	r := New[string](redisstore.New(c, "killed"), 2, WithLeaseTTL(300*time.Millisecond))
	for range 2 {
		_, err := r.Acquire(context.Background(), "k")
		require.NoError(t, err)
	}
	fmt.Println("held")
	select {} // until SIGKILL
}
