package fleet

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

const (
	fwKillEnv     = "FLEET_QUEUEKILL_CHILD"
	fwKillName    = "fw-kill"
	fwKillTTL     = 900 * time.Millisecond
	fwKillWaiters = 100 // the child's
)

// A gateway process killed with SIGKILL while 100 of its callers wait on a
// full key, ahead of another process's: those later waiters are admitted
// no more than the liveness TTL later than they would have been without
// the dead process's waiters (a control run on another key, with the same
// holder, waiters and hold times, but no child).
//
// The liveness TTL is the smaller of the lease TTL and five claim windows
// (a third of the lease TTL each): here the lease TTL (fwKillTTL).
func TestFleetKilledWaitersProcess(t *testing.T) {
	if os.Getenv(fwKillEnv) != "" {
		t.Skip("in a child process")
	}
	srv := redistest.Start(t)
	const (
		hold     = 20 * time.Millisecond
		parentN  = 3
		liveness = fwKillTTL
	)
	holder := New[string](redisstore.New(srv.Client(), fwKillName), 1, WithLeaseTTL(fwKillTTL))
	defer holder.Close()
	parent := New[string](redisstore.New(srv.Client(), fwKillName), 1, WithLeaseTTL(fwKillTTL))
	defer parent.Close()

	// run fills key from the holder, calls afterHeld, queues parentN
	// waiters in the parent, one after another, calls beforeRelease, then
	// releases the holder's lease; it returns each waiter's wait from that
	// release, in arrival order. Each admitted waiter holds key for hold.
	run := func(key string, afterHeld, beforeRelease func()) []time.Duration {
		held, err := holder.TryAcquire(key)
		require.NoError(t, err)
		afterHeld()
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		waits := make([]time.Duration, parentN)
		var released time.Time
		start := make(chan struct{}) // closed once released is set
		var wg sync.WaitGroup
		errs := make(chan error, parentN)
		for i := range parentN {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := parent.Acquire(ctx, key)
				if err != nil {
					errs <- err
					return
				}
				<-start
				waits[i] = time.Since(released)
				time.Sleep(hold) // the request's work
				s.Release()
			}()
			fwUntil(t, "the parent's waiter waits", func() bool { return parent.Stats().Waiting >= i+1 })
		}
		// One more round trip from the parent: its waiters' first calls
		// have gone out, and the key is full.
		_, err = parent.TryAcquire(key)
		require.ErrorIs(t, err, slots.ErrLimitReached)
		beforeRelease()
		released = time.Now()
		close(start)
		held.Release()
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "a parent waiter was not admitted")
		}
		return waits
	}

	control := run("ctl", func() {}, func() {})

	// The child's waiters queue on the full key before the parent's, so
	// that they are ahead of them when it is killed.
	var exited chan error
	var cmd *exec.Cmd
	startChild := func() {
		cmd = exec.Command(os.Args[0], "-test.run=^TestFleetKilledWaitersChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), fwKillEnv+"=1", "FLEET_REDIS="+srv.Addr)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() }) // if the test stops early
		queued := make(chan struct{})
		exited = make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if sc.Text() == "queued" {
					close(queued)
				}
			}
			exited <- cmd.Wait()
		}()
		select {
		case <-queued:
		case err := <-exited:
			t.Fatalf("the child exited before its waiters queued: %v", err)
		case <-time.After(30 * time.Second): // a bound on a hang
			t.Fatal("the child's waiters never queued")
		}
	}
	killed := run("k", startChild, func() {
		require.NoError(t, cmd.Process.Kill()) // SIGKILL: its waiters vanish
		<-exited
	})

	worst := killed[0] - control[0]
	for i := range parentN {
		extra := killed[i] - control[i]
		worst = max(worst, extra)
		t.Logf("parent waiter %d: waited %s after the release with %d dead waiters ahead, %s without (position x hold: %s); %s longer",
			i+1, fwMs(killed[i]), fwKillWaiters, fwMs(control[i]), fwMs(time.Duration(i)*hold), fwMs(extra))
	}
	t.Logf("killed process with %d queued waiters: worst extra wait of a later waiter %s (goal <= liveness TTL %s)",
		fwKillWaiters, fwMs(worst), fwMs(liveness))
	fwGoal(t, worst <= liveness, fmt.Sprintf("worst extra wait %s behind a killed process's waiters (goal <= %s)", fwMs(worst), fwMs(liveness)),
		"a waiter behind a killed process's waiters waited %v longer, over the liveness TTL %v", worst, liveness)
}

// TestFleetKilledWaitersChild is the process that TestFleetKilledWaitersProcess
// kills: it queues fwKillWaiters callers on the full key and waits to be
// killed.
func TestFleetKilledWaitersChild(t *testing.T) {
	if os.Getenv(fwKillEnv) == "" {
		t.Skip("run by TestFleetKilledWaitersProcess")
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("FLEET_REDIS")})
	r := New[string](redisstore.New(c, fwKillName), 1, WithLeaseTTL(fwKillTTL))
	for range fwKillWaiters {
		go func() { _, _ = r.Acquire(context.Background(), "k") }()
	}
	fwUntil(t, "the child's waiters queue in Redis", func() bool {
		n, err := c.ZCard(context.Background(), "inflight:{"+fwKillName+"}:k#q").Result()
		return err == nil && n >= fwKillWaiters
	})
	fmt.Println("queued")
	select {} // until SIGKILL
}
