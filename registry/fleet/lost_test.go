package fleet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// A holder that did not renew for longer than the lease TTL (its process
// stopped, or starved) finds its leases expired and the cap taken by
// others. Redis kept its data (the epoch is the same), so the leases go
// back only if there is room: here there is none, and they are reported
// lost, with the holder's context cancelled; Redis still counts 2 for the
// cap of 2. Once a holder releases, the next renewal puts one back. The
// pause is the server's clock moved past the TTL; the TTL of a minute keeps
// the heartbeats out of the way.
func TestExpiredLeaseGoesBackOnlyIfRoom(t *testing.T) {
	m := newMini(t)
	slow := m.registry(2, WithLeaseTTL(time.Minute))
	ctx, cancel := WithCancelOnLost(context.Background())
	defer cancel()
	var held []*slots.Slot
	for range 2 {
		s, err := slow.Acquire(ctx, "k")
		require.NoError(t, err)
		held = append(held, s)
	}
	m.pass(61*time.Second, time.Minute) // the holder's pause, while others are heard: its leases expire

	other := m.registry(2, WithLeaseTTL(time.Minute))
	var others []*slots.Slot
	for range 2 {
		s, err := other.TryAcquire("k")
		require.NoError(t, err, "the expired leases do not count")
		others = append(others, s)
	}
	require.True(t, slow.renew(), "the holder resumes: its heartbeat renews")
	assert.Len(t, m.leases("k"), 2, "Redis counts 2 for the cap of 2")
	st := slow.Stats()
	assert.Equal(t, uint64(2), st.Lost)
	assert.Zero(t, st.Reasserted)
	select {
	case <-ctx.Done():
		assert.ErrorIs(t, context.Cause(ctx), ErrLeaseLost)
	default:
		t.Error("the holder's context (WithCancelOnLost) was not cancelled")
	}

	others[0].Release()
	eventually(t, "released", func() bool { return len(m.leases("k")) == 1 })
	require.True(t, slow.renew())
	assert.Len(t, m.leases("k"), 2, "one lost lease goes back, now that there is room")
	st = slow.Stats()
	assert.Equal(t, uint64(2), st.Lost, "each counted lost once")
	assert.Equal(t, uint64(1), st.Reasserted)
	others[1].Release()
	for _, s := range held {
		s.Release()
	}
	eventually(t, "all removed", func() bool { return len(m.leases("k")) == 0 })
}

// Leases that Redis lost with its data (killed and restarted empty) go back
// without a check, even over the cap that new admissions filled meanwhile:
// their holders are still working. The epoch, gone with the data, tells
// this from leases that expired. The admissions here come from a process
// that never saw the old epoch, which cannot tell the loss from a first
// start, so nothing pauses them (see pause_test.go for the pause).
func TestLeasesLostInRestartGoBack(t *testing.T) {
	srv := redistest.Start(t)
	holder := New[string](redisstore.New(srv.Client(), "r"), 2, WithLeaseTTL(time.Minute))
	defer holder.Close()
	ctx, cancel := WithCancelOnLost(context.Background())
	defer cancel()
	for range 2 {
		s, err := holder.Acquire(ctx, "k")
		require.NoError(t, err)
		defer s.Release()
	}
	srv.Kill()
	srv.Restart()

	other := New[string](redisstore.New(srv.Client(), "r"), 2, WithLeaseTTL(time.Minute))
	defer other.Close()
	for range 2 {
		s, err := other.TryAcquire("k")
		require.NoError(t, err, "Redis lost the holder's leases")
		require.False(t, s.Degraded())
		defer s.Release()
	}
	// The holder's heartbeat renews (its first call may meet a connection
	// the restart broke).
	require.Eventually(t, holder.renew, 10*time.Second, time.Millisecond)
	n, err := other.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 4, n, "put back without a check")
	st := holder.Stats()
	assert.Equal(t, uint64(2), st.Lost)
	assert.Equal(t, uint64(2), st.Reasserted)
	assert.NoError(t, ctx.Err(), "the holder goes on")
}

// A holder process stopped with SIGSTOP for longer than the lease TTL, and
// resumed with SIGCONT once this process holds the cap: its leases expired
// under it, so they do not go back over the cap. The child (this test
// binary, run again) reports what it saw when its heartbeat found them lost.
func TestPausedHolderProcess(t *testing.T) {
	if os.Getenv("FLEET_PAUSED_CHILD") != "" {
		t.Skip("in a child process")
	}
	srv := redistest.Start(t)
	const ttl = 300 * time.Millisecond
	live := New[string](redisstore.New(srv.Client(), "paused"), 2, WithLeaseTTL(ttl))
	defer live.Close()
	ctx := context.Background()

	cmd := exec.Command(os.Args[0], "-test.run=^TestPausedHolderChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FLEET_PAUSED_CHILD=1", "FLEET_REDIS="+srv.Addr)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	errFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer errFile.Close()
	cmd.Stderr = errFile
	stderr := func() string { b, _ := os.ReadFile(errFile.Name()); return string(b) }
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var exitErr error
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
		close(lines)
		exitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-exited
	})
	next := func(prefix string) string {
		t.Helper()
		timeout := time.After(30 * time.Second) // a bound on a hang
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the child exited before %q:\n%s", prefix, stderr())
				}
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-timeout:
				t.Fatalf("no %q from the child:\n%s", prefix, stderr())
			}
		}
	}

	next("held")
	n, err := live.InFlight(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 2, n, "the child holds the cap")
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	require.Eventually(t, func() bool {
		n, err := live.InFlight(ctx, "k")
		return err == nil && n == 0
	}, 10*time.Second, time.Millisecond, "the stopped child's leases expire")
	for range 2 {
		s, err := live.TryAcquire("k")
		require.NoError(t, err)
		defer s.Release()
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))

	var lost, reasserted, cancelled int
	_, err = fmt.Sscanf(next("result"), "result lost=%d reasserted=%d cancelled=%d", &lost, &reasserted, &cancelled)
	require.NoError(t, err)
	n, err = live.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "Redis counts 2 for the cap of 2 after the child resumed")
	assert.Equal(t, 2, lost)
	assert.Zero(t, reasserted, "nothing put back over the cap")
	assert.Equal(t, 2, cancelled, "the child's contexts (WithCancelOnLost) cancelled")
	<-exited
	require.NoError(t, exitErr, "the child:\n%s", stderr())
}

// TestPausedHolderChild is the holder process of TestPausedHolderProcess:
// it holds the cap of 2 and, once its heartbeat has found both leases
// missing (and put them back, or not), prints what it counted.
func TestPausedHolderChild(t *testing.T) {
	if os.Getenv("FLEET_PAUSED_CHILD") == "" {
		t.Skip("run by TestPausedHolderProcess")
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("FLEET_REDIS")})
	defer c.Close()
	r := New[string](redisstore.New(c, "paused"), 2, WithLeaseTTL(300*time.Millisecond))
	defer r.Close()
	var ctxs []context.Context
	for range 2 {
		ctx, cancel := WithCancelOnLost(context.Background())
		defer cancel()
		s, err := r.Acquire(ctx, "k")
		require.NoError(t, err)
		defer s.Release()
		ctxs = append(ctxs, ctx)
	}
	fmt.Println("held")
	require.Eventually(t, func() bool { return r.Stats().Lost >= 2 }, 30*time.Second, time.Millisecond)
	// A lost lease is counted under the Registry's lock and its holder's
	// context cancelled after it, with no lock held: each context is
	// waited for, up to a bound by which one never cancelled counts out.
	bound, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	cancelled := 0
	for _, ctx := range ctxs {
		select {
		case <-ctx.Done():
		case <-bound.Done():
		}
		if context.Cause(ctx) == ErrLeaseLost {
			cancelled++
		}
	}
	st := r.Stats()
	fmt.Printf("result lost=%d reasserted=%d cancelled=%d\n", st.Lost, st.Reasserted, cancelled)
}

// With ReportLost a lost lease is counted and logged once, not at every
// renewal.
func TestReportLostCountedOnce(t *testing.T) {
	m := newMini(t)
	r := m.registry(1, WithLostLeases(ReportLost))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	m.Srv.FlushAll()
	for range 3 {
		r.renew()
	}
	assert.Equal(t, uint64(1), r.Stats().Lost)
	s.Release()
}
