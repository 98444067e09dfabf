package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// runMainEnv makes the test binary run the gateway's main instead of the
// tests, so that the tests can signal a real gateway process.
const runMainEnv = "GATEWAY_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	redistest.Main(m, "examples/gateway")
}

func TestGatewayBadConfigExits2(t *testing.T) {
	dir := t.TempDir()
	for name, cfg := range map[string]string{
		"negative org limit":  `{"upstream":"http://127.0.0.1:1","orgs":{"default_limit":-1}}`,
		"bad provider":        `{"upstream":"http://127.0.0.1:1","provider":{"requests_per_minute":-5}}`,
		"no upstream":         `{}`,
		"unknown field":       `{"upstream":"http://127.0.0.1:1","orgz":{}}`,
		"admin without token": `{"upstream":"http://127.0.0.1:1","admin":{}}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".json")
			require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
			var stderr strings.Builder
			assert.Equal(t, 2, run([]string{"-config", path}, &stderr, nil))
			assert.Contains(t, stderr.String(), `msg="gateway: bad configuration" error="config:`)
		})
	}
	t.Run("an unset api_key_env variable", func(t *testing.T) {
		path := filepath.Join(dir, "api_key_env.json")
		require.NoError(t, os.WriteFile(path, []byte(`{"upstream":"http://127.0.0.1:1",
			"provider":{"api_keys":[{"id":"k1"}]},"api_key_env":{"k1":"GATEWAY_TEST_NO_SUCH_KEY"}}`), 0o600))
		var stderr strings.Builder
		assert.Equal(t, 2, run([]string{"-config", path}, &stderr, nil))
		assert.Contains(t, stderr.String(), `config: api_key_env[\"k1\"]: the environment variable GATEWAY_TEST_NO_SUCH_KEY is not set`)
	})
	t.Run("a redis_url that does not parse, without its password", func(t *testing.T) {
		path := filepath.Join(dir, "redis_url.json")
		require.NoError(t, os.WriteFile(path, []byte(`{"upstream":"http://127.0.0.1:1",
			"fleet":{"redis_url":"redis://:hunter2@127.0.0.1:notaport/0"}}`), 0o600))
		var stderr strings.Builder
		assert.Equal(t, 2, run([]string{"-config", path}, &stderr, nil))
		assert.Contains(t, stderr.String(), "config: fleet.redis_url: not a valid redis URL")
		assert.NotContains(t, stderr.String(), "hunter2")
	})
	assert.Equal(t, 2, run(nil, io.Discard, nil), "-config is required")
	var usage strings.Builder
	assert.Equal(t, 0, run([]string{"-h"}, &usage, nil))
	assert.Contains(t, usage.String(), "-log-level")
}

// A gateway that cannot start for want of its store (a PostgreSQL fleet
// whose database does not answer, so its tables cannot be made) exits 1,
// as run says: 2 tells a supervisor the configuration is bad, and a
// retry cannot help.
func TestGatewayThatCannotStartExits1(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "gateway.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"upstream":"http://127.0.0.1:1",
		"fleet":{"postgres_url":"postgres://gateway@`+dead+`/gateway"}}`), 0o600))
	var stderr strings.Builder
	assert.Equal(t, 1, run([]string{"-config", path}, &stderr, nil))
	assert.Contains(t, stderr.String(), `msg="gateway: cannot start"`)
}

// process is a gateway started from the test binary.
type process struct {
	cmd   *exec.Cmd
	addr  string
	lines chan string // stderr, line by line; closed at EOF
	mu    sync.Mutex
	log   strings.Builder // every line read so far
	done  chan error
}

var listeningAddr = regexp.MustCompile(`msg="gateway: listening" addr=(\S+)`)

// startProcess runs the gateway with config (a JSON text) and waits until
// it has logged that it listens.
func startProcess(t *testing.T, config string, args ...string) *process {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway.json")
	require.NoError(t, os.WriteFile(path, []byte(config), 0o600))
	cmd := exec.Command(os.Args[0], append([]string{"-config", path}, args...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &process{cmd: cmd, lines: make(chan string, 256), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range p.lines {
		}
	})
	m := listeningAddr.FindStringSubmatch(p.waitLine(t, `msg="gateway: listening"`))
	require.NotNil(t, m)
	p.addr = m[1]
	return p
}

// waitLine returns the first line from now on that contains s.
func (p *process) waitLine(t *testing.T, s string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			require.True(t, ok, "the gateway exited before logging %q:\n%s", s, p.logged())
			if strings.Contains(line, s) {
				return line
			}
		case <-timeout:
			t.Fatalf("no line with %q in 30 s:\n%s", s, p.logged())
		}
	}
}

func (p *process) logged() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// exitCode waits for the process to end, reading the rest of its log.
func (p *process) exitCode(t *testing.T) int {
	t.Helper()
	for range p.lines {
	}
	err := <-p.done
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// streamingUpstream sends one event, waits for release, then sends the
// last event and [DONE].
func streamingUpstream(t *testing.T) (*httptest.Server, chan struct{}) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: last\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	return up, release
}

// openStream posts a streamed request and returns once its first event has
// arrived.
func openStream(t *testing.T, addr string) (*http.Response, *bufio.Reader) {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "data: first\n", line)
	return resp, br
}

func TestDrainOnSIGTERM(t *testing.T) {
	up, release := streamingUpstream(t)
	p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"`+up.URL+`","shutdown_timeout_ms":20000}`)
	_, stream := openStream(t, p.addr)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	assert.Contains(t, p.waitLine(t, `msg="gateway: draining"`), "signal=terminated in_flight=1")
	_, err := net.DialTimeout("tcp", p.addr, time.Second)
	assert.Error(t, err, "no new connections while draining")

	close(release) // the stream in flight goes on to its end
	rest, err := io.ReadAll(stream)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: last\n\ndata: [DONE]\n\n", string(rest), "the stream completes with its last event")
	assert.Equal(t, 0, p.exitCode(t))
	assert.Regexp(t, `msg="gateway: drained" requests=1 took=\S+ tenant_keys_held=0 provider_in_flight=0`, p.logged())
}

func TestSecondSignalExitsAtOnce(t *testing.T) {
	up, release := streamingUpstream(t)
	defer close(release)
	p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"`+up.URL+`"}`)
	_, stream := openStream(t, p.addr)

	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.waitLine(t, `msg="gateway: draining"`)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	assert.Equal(t, 1, p.exitCode(t))
	assert.Less(t, time.Since(start), 10*time.Second, "well within the 30 s drain")
	assert.Contains(t, p.logged(), `msg="gateway: second signal, exiting now" signal=interrupt`)
	assert.Contains(t, p.logged(), `msg="gateway: drain cut short" drained=0 cut=1`)
	rest, _ := io.ReadAll(stream)
	assert.NotContains(t, string(rest), "[DONE]", "the stream was cut")
}

// At startup: the line after the bind names the address and the effective
// config without its secrets; an unreachable Redis is named at once; and
// go-redis's own messages come through slog.
func TestStartupLogs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadRedis := ln.Addr().String()
	ln.Close()
	const token = "startup-admin-token-0123456789"
	const apiKey = "sk-startup-secret-0123456789"
	t.Setenv("GATEWAY_TEST_API_KEY", apiKey)
	p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"http://gw:upstream-pass@127.0.0.1:9",
		"admin":{"token":"`+token+`"},
		"provider":{"api_keys":[{"id":"k1"}]},"api_key_env":{"k1":"GATEWAY_TEST_API_KEY"},
		"fleet":{"redis_url":"redis://:hunter2@`+deadRedis+`/0"}}`)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	status, body := get(t, &http.Client{Transport: tr}, "http://"+p.addr+"/metrics", "")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, `cap="api_key:k1"`)
	assert.NotContains(t, body, apiKey)
	status, body = get(t, &http.Client{Transport: tr}, "http://"+p.addr+"/debug/provider", "Bearer "+token)
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, `"in_flight_by_api_key"`)
	assert.NotContains(t, body, apiKey)
	warn := p.waitLine(t, `msg="gateway: redis is unreachable at startup`)
	assert.Contains(t, warn, "on_unavailable=local")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, 0, p.exitCode(t))
	logged := p.logged()
	assert.Contains(t, logged, `config="{\"listen\":\"127.0.0.1:0\"`)
	assert.Contains(t, logged, `\"admin\":{\"token\":\"[redacted]\"}`)
	assert.NotContains(t, logged, token)
	assert.NotContains(t, logged, "hunter2")
	assert.NotContains(t, logged, "upstream-pass")
	assert.NotContains(t, logged, apiKey)
	assert.Contains(t, logged, "upstream=http://gw:xxxxx@127.0.0.1:9 ")
	assert.Contains(t, logged, `\"api_key_env\":{\"k1\":\"GATEWAY_TEST_API_KEY\"}`)
	assert.Contains(t, logged, `msg="gateway: redis client" detail="connection pool: failed to dial`, "go-redis's own messages")
	for _, line := range strings.Split(strings.TrimSpace(logged), "\n") {
		assert.True(t, strings.HasPrefix(line, "time="), "every line through slog: %q", line)
	}
}

// With admin.listen, the admin and debug endpoints are served on their own
// address, behind the token, and not beside the model API.
func TestAdminListener(t *testing.T) {
	const token = "listener-admin-token-0123456789"
	t.Setenv("GATEWAY_TEST_ADMIN_TOKEN", token)
	p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"http://127.0.0.1:9",
		"admin":{"token_env":"GATEWAY_TEST_ADMIN_TOKEN","listen":"127.0.0.1:0"}}`)
	m := regexp.MustCompile(`admin_addr=(\S+)`).FindStringSubmatch(p.logged())
	require.NotNil(t, m, "the listening line names the admin address:\n%s", p.logged())
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	get := func(addr, auth string) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/debug/slots", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, get(m[1], "Bearer "+token))
	assert.Equal(t, http.StatusUnauthorized, get(m[1], ""))
	assert.Equal(t, http.StatusNotFound, get(p.addr, "Bearer "+token), "not on the model API's address")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, 0, p.exitCode(t))
}

// get makes a GET with an optional Authorization header and returns the
// status and the body.
func get(t *testing.T, client *http.Client, url, auth string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
