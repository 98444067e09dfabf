// Package pgtest runs a real PostgreSQL server for a test (as
// net/http/httptest runs a server): a new cluster made by initdb in a
// temporary directory, listening on a random 127.0.0.1 port, removed at the
// test's cleanup; and the faults a test needs from it: a crash (Kill, then
// Restart with the data kept), a hang (Stop and Cont: SIGSTOP and SIGCONT);
// and PgBouncer in front of it in transaction mode (Bouncer).
//
// The server's binaries are looked for on PATH, then in Debian's
// /usr/lib/postgresql/<version>/bin. As root, the cluster belongs to the
// postgres user and its server runs as that user (PostgreSQL refuses to run
// as root). Without the binaries the test is skipped, unless
// INFLIGHT_REQUIRE_POSTGRES is set (as CI sets it): then it fails.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// RequireEnv, when set, turns missing PostgreSQL binaries (and a missing
// PgBouncer, for Bouncer) into a test failure.
const RequireEnv = "INFLIGHT_REQUIRE_POSTGRES"

// Server is a running PostgreSQL server, with one database, "inflight",
// that the user "inflight" owns and reaches without a password.
type Server struct {
	// URL is the connection string of the database.
	URL  string
	t    tb
	bin  string // the directory of the server's binaries
	dir  string // the cluster's data directory
	port int
	cred *syscall.Credential // the postgres user's, as root; nil otherwise
	cmd  *exec.Cmd
	exit chan struct{}
	// closeFn stops a server made by Launch.
	closeFn func()
}

// Start makes a cluster and starts its server, with the settings a test
// wants to see in production: fsync and synchronous commits on (sessions
// may turn the latter off).
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t)
}

func start(t tb) *Server {
	t.Helper()
	bin := binDir(t)
	s := &Server{t: t, bin: bin, port: pickPort(t)}
	s.URL = fmt.Sprintf("postgres://inflight@127.0.0.1:%d/inflight?sslmode=disable", s.port)
	root, err := os.MkdirTemp("", "inflight-pg-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	s.dir = filepath.Join(root, "data")
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root needs a postgres user to run the server as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(root, 0o755); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if err := os.Mkdir(s.dir, 0o700); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if err := os.Chown(s.dir, uid, gid); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	s.run("initdb", "-D", s.dir, "-U", "inflight", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	t.Cleanup(s.Kill) // before the start: a server that fails to answer is killed too
	// The port was free when freePort chose it, but another process may
	// take it before the server binds it (a client's connection takes its
	// port from the same range): then the server exits at once, and
	// starts again on another.
	for try := 1; !s.launch(); try++ {
		if try == 3 || !strings.Contains(s.cmd.Stderr.(*tail).String(), "could not create any TCP/IP sockets") {
			t.Fatalf("pgtest: postgres exited at start: %v\n%s", s.cmd.ProcessState, s.cmd.Stderr)
		}
		s.port = pickPort(t)
		s.URL = fmt.Sprintf("postgres://inflight@127.0.0.1:%d/inflight?sslmode=disable", s.port)
	}
	conn := s.connect("postgres")
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE inflight"); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return s
}

// tb is what a Server needs of the test it runs for: testing.TB, or a
// program's stand-in (see Launch).
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
}

// Launch starts a server as Start does, for a program rather than a test
// (a demo, a tool): it returns an error where Start would fail or skip
// the test, and the server runs until Close. Its fault methods (Kill,
// Stop, ...) are for tests: in a program, one that fails panics.
func Launch() (s *Server, err error) {
	p := &program{}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(failure)
			if !ok {
				panic(r)
			}
			p.close()
			s, err = nil, f
		}
	}()
	s = start(p)
	s.closeFn = p.close
	return s, nil
}

// Close stops a server made by Launch (SIGKILL: its data goes with it)
// and removes its files.
func (s *Server) Close() {
	if s.closeFn != nil {
		s.closeFn()
	}
}

// program stands in for a test in Launch: a failure or a skip panics
// with a failure, which Launch returns, and cleanups run at Close, the
// latest first.
type program struct {
	mu       sync.Mutex
	cleanups []func()
}

type failure string

func (f failure) Error() string { return string(f) }

func (p *program) Helper()                           {}
func (p *program) Fatalf(format string, args ...any) { panic(failure(fmt.Sprintf(format, args...))) }
func (p *program) Skip(args ...any)                  { panic(failure(fmt.Sprint(args...))) }

func (p *program) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

func (p *program) close() {
	p.mu.Lock()
	fs := p.cleanups
	p.cleanups = nil
	p.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// SkipWithout skips t if PostgreSQL's binaries are missing (fails it, if
// RequireEnv is set), as Start would: for a test that starts a server
// some other way.
func SkipWithout(t testing.TB) {
	t.Helper()
	binDir(t)
}

// binDir returns the directory of initdb and postgres, or skips t.
func binDir(t tb) string {
	t.Helper()
	if p, err := exec.LookPath("initdb"); err == nil {
		if q, err := exec.LookPath("postgres"); err == nil && filepath.Dir(p) == filepath.Dir(q) {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) }) // the newest first
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("PostgreSQL's initdb and postgres not found, and %s is set", RequireEnv)
	}
	t.Skip("PostgreSQL's initdb and postgres not found (install them, e.g. apt-get install postgresql)")
	return ""
}

// version is the major version in a Debian binaries' directory's path.
func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// pickPort chooses a server's port (a test of the retries takes one that
// is not free).
var pickPort = freePort

func freePort(t tb) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// command returns the binary name's command, run as the postgres user as
// root.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = filepath.Dir(s.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

// run runs a binary to its end, failing the test if it fails.
func (s *Server) run(name string, args ...string) {
	s.t.Helper()
	if out, err := s.command(name, args...).CombinedOutput(); err != nil {
		s.t.Fatalf("pgtest: %s: %v\n%s", name, err, out)
	}
}

// Restart starts the server (again, after Kill) on the same port, with the
// data it has; it returns once the server accepts connections. After a
// Kill the server recovers from its write-ahead log first: what was
// committed asynchronously in the last moments may be lost.
func (s *Server) Restart() {
	s.t.Helper()
	if !s.launch() {
		s.t.Fatalf("pgtest: postgres exited at start: %v\n%s", s.cmd.ProcessState, s.cmd.Stderr)
	}
}

// launch starts the server on its port and waits until it accepts
// connections: false if it exited first.
func (s *Server) launch() bool {
	s.t.Helper()
	s.cmd = s.command("postgres", "-D", s.dir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "max_connections=200",
		"-c", "logging_collector=off", "-c", "log_min_messages=fatal")
	s.cmd.Stderr = &tail{}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("pgtest: start postgres: %v", err)
	}
	s.exit = make(chan struct{})
	go func(cmd *exec.Cmd, exit chan struct{}) {
		_ = cmd.Wait()
		close(exit)
	}(s.cmd, s.exit)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.dsn("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return true
		}
		select {
		case <-s.exit:
			return false
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("pgtest: postgres on port %d not accepting connections: %v", s.port, err)
		}
		time.Sleep(10 * time.Millisecond) // a process starting: poll its port
	}
}

func (s *Server) dsn(db string) string {
	return fmt.Sprintf("postgres://inflight@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

func (s *Server) connect(db string) *pgx.Conn {
	s.t.Helper()
	conn, err := pgx.Connect(context.Background(), s.dsn(db))
	if err != nil {
		s.t.Fatalf("pgtest: connect: %v", err)
	}
	return conn
}

// Kill stops the server at once, as a crash of its host would: SIGKILL to
// the postmaster and every process it started. The data directory stays:
// Restart recovers it from the write-ahead log.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	pids := s.freeze() // a backend forked meanwhile would outlive the kill
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-s.exit
	s.cmd = nil
	// A restart needs the shared memory the backends held: wait for them.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for running(pid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // processes of another user exiting
		}
	}
}

// Stop stops the postmaster and every process it started with SIGSTOP,
// as a host that hangs would: connections stay open and calls wait, until
// Cont (at the test's cleanup if not before).
func (s *Server) Stop() {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatalf("pgtest: Stop of a server that is not running")
	}
	for _, pid := range s.freeze()[1:] {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	s.t.Cleanup(func() {
		if s.cmd != nil {
			for _, pid := range s.processes() {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	})
}

// Cont resumes a server stopped by Stop.
func (s *Server) Cont() { s.signalAll(syscall.SIGCONT) }

func (s *Server) signalAll(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatalf("pgtest: %v to a server that is not running", sig)
	}
	for _, pid := range s.processes() {
		_ = syscall.Kill(pid, sig)
	}
}

// freeze stops the postmaster (SIGSTOP) and waits until it has stopped,
// so that it forks no more, then returns it, first, and the processes it
// started. (Listed before the postmaster stopped, a backend it forked
// for a new connection meanwhile would be missed, and would go on
// serving that connection while the server is meant to hang.)
func (s *Server) freeze() []int {
	pm := s.cmd.Process.Pid
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	for deadline := time.Now().Add(10 * time.Second); !stopped(pm) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // the signal's delivery
	}
	return append([]int{pm}, children(pm)...)
}

// stopped reports whether pid is stopped by a signal.
func stopped(pid int) bool {
	fields := statFields("/proc/" + strconv.Itoa(pid) + "/stat")
	return len(fields) > 0 && (fields[0] == "T" || fields[0] == "t")
}

// processes returns the postmaster, first, and the processes it started
// (each makes a session of its own, so no process group holds them all).
func (s *Server) processes() []int {
	pm := s.cmd.Process.Pid
	return append([]int{pm}, children(pm)...)
}

// children returns the processes whose parent is pid, from /proc.
func children(pid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		fields := statFields(f)
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			out = append(out, child)
		}
	}
	return out
}

// running reports whether pid is a process that has not exited (a zombie
// has).
func running(pid int) bool {
	fields := statFields("/proc/" + strconv.Itoa(pid) + "/stat")
	return len(fields) > 0 && fields[0] != "Z"
}

// statFields returns the fields of a /proc stat file after the command's
// name (state, ppid, ...); nil if it cannot be read.
func statFields(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// tail keeps the last 8 KiB a process wrote, for a failure's message.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 8<<10 {
		w.b = w.b[len(w.b)-8<<10:]
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
