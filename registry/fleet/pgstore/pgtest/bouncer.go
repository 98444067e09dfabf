package pgtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Bouncer starts PgBouncer in front of the server, pooling in transaction
// mode (a server connection is lent to a client for one transaction at a
// time), and returns the URL of the database through it. It listens on a
// random 127.0.0.1 port and is stopped at the test's cleanup; it outlives a
// Kill and Restart of the server, and connects to it again.
//
// Its prepared statement support (PgBouncer 1.21 and later) is off: a
// statement prepared on one server connection is not on the others.
//
// The binary is looked for on PATH, then in /usr/sbin (Debian's package);
// without it the test is skipped, or fails if RequireEnv is set. As root it
// runs as the postgres user (PgBouncer refuses to run as root).
func (s *Server) Bouncer() string {
	s.t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, err := os.Stat(bin); err != nil {
			if os.Getenv(RequireEnv) != "" {
				s.t.Fatalf("PgBouncer not found, and %s is set", RequireEnv)
			}
			s.t.Skip("PgBouncer not found (install it, e.g. apt-get install pgbouncer)")
		}
	}
	dir, err := os.MkdirTemp("", "inflight-pgbouncer-")
	if err != nil {
		s.t.Fatalf("pgtest: %v", err)
	}
	s.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // readable by the postgres user, as root
		s.t.Fatalf("pgtest: %v", err)
	}
	// From 1.21 PgBouncer can keep prepared statements apart per client
	// (max_prepared_statements, on by default from 1.24): turned off, so
	// that every version pools as 1.18 does, where a prepared statement is
	// the server connection's.
	var major, minor int
	out, _ := exec.Command(bin, "--version").Output()
	_, _ = fmt.Sscanf(string(out), "PgBouncer %d.%d", &major, &minor)
	prepared := ""
	if major > 1 || major == 1 && minor >= 21 {
		prepared = "max_prepared_statements = 0\n"
	}
	// trust: the user must still be named in the auth file. The pool is
	// larger than any test's pools together, so that no client waits for a
	// server connection behind another's transaction for long. After a
	// failed login to the server (one down, or restarting) PgBouncer turns
	// clients away for server_login_retry (15 s by default): 1 s, so that
	// a test of a restart sees the server back within its wait.
	ini := func(port int) string {
		return fmt.Sprintf(`[databases]
inflight = host=127.0.0.1 port=%d dbname=inflight user=inflight

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 40
max_client_conn = 1000
server_reset_query =
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
%s`, s.port, port, filepath.Join(dir, "users.txt"), prepared)
	}
	// The port was free when freePort chose it, but another process may
	// take it before PgBouncer binds it: then it exits at once, and starts
	// again on another.
	for try := 1; ; try++ {
		port := pickPort(s.t)
		for name, text := range map[string]string{"pgbouncer.ini": ini(port), "users.txt": `"inflight" ""` + "\n"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				s.t.Fatalf("pgtest: %v", err)
			}
		}
		cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
		cmd.Stderr = &tail{}
		if err := cmd.Start(); err != nil {
			s.t.Fatalf("pgtest: start pgbouncer: %v", err)
		}
		exit := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exit)
		}()
		s.t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exit
		})
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		err := listening(addr, exit)
		if err == nil {
			return fmt.Sprintf("postgres://inflight@%s/inflight?sslmode=disable", addr)
		}
		if !errors.Is(err, errExited) || try == 3 {
			s.t.Fatalf("pgtest: pgbouncer on %s: %v\n%s", addr, err, cmd.Stderr)
		}
	}
}

// errExited is listening's error for a process that exited at start.
var errExited = errors.New("exited at start")

// listening waits until addr accepts connections, or the process's exit
// is closed, or 30 s have passed.
func listening(addr string, exit <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-exit:
			return errExited
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond) // a process starting: poll its port
	}
}
