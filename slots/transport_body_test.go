package slots_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// closedAfter is a request body as a server hands it to a proxy: it gives
// its bytes, and once its server has read the rest away and closed it (as
// net/http's does when the handler's answer starts), a read fails with
// http.ErrBodyReadAfterClose instead of ending with io.EOF.
type closedAfter struct {
	r      io.Reader
	closed bool // the server closed it midway, before the bytes were all read
}

func (b *closedAfter) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.closed = true // the server's close came before the reader's last read
		return n, http.ErrBodyReadAfterClose
	}
	return n, err
}

func (b *closedAfter) Close() error { return nil }

// TestTransportBodyClosedAtItsEnd: net/http's HTTP/1 transport reads a
// request body of known length once more after its last byte, to check
// that it is not longer. When the body is a server's inbound one (a
// proxy's), that read may come after the server has closed it, once the
// answer's header went to the client; the read then fails, and the
// transport would drop the upstream connection and cut the streaming
// answer. The Transport takes a close found after the declared length as
// the body's end; a body closed before it still fails the request.
func TestTransportBodyClosedAtItsEnd(t *testing.T) {
	var got []string
	var mu sync.Mutex
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	lim := slots.NewLimiter(1)
	tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })

	t.Run("closed after its last byte: sent whole, and the answer streams whole", func(t *testing.T) {
		for range 3 { // on one connection, which must stay usable
			const body = `{"stream":true}`
			req, err := http.NewRequest(http.MethodPost, up.URL, &closedAfter{r: strings.NewReader(body)})
			require.NoError(t, err)
			req.ContentLength = int64(len(body))
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			all, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, "data: 0\n\ndata: 1\n\ndata: 2\n\n", string(all))
			assert.Zero(t, lim.InFlight())
		}
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []string{`{"stream":true}`, `{"stream":true}`, `{"stream":true}`}, got)
	})

	t.Run("closed before its last byte: the request fails, and frees its slot", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPost, up.URL, &closedAfter{r: strings.NewReader(`{"str`)})
		require.NoError(t, err)
		req.ContentLength = int64(len(`{"stream":true}`))
		resp, err := tr.RoundTrip(req)
		if err == nil { // the answer came first: its stream must not end cleanly
			_, err = io.ReadAll(bufio.NewReader(resp.Body))
			resp.Body.Close()
		}
		assert.Error(t, err)
		assert.Zero(t, lim.InFlight())
	})
}

// A body with Write and CloseWrite (a connection) is open until closed: reading
// to io.EOF, by Read or by WriteTo, says only that the other side is done
// sending, so the slot stays; the Close that follows frees it at once, as
// the end of the exchange rather than a cut (no linger).
func TestWritableBodyHeldUntilClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		read func(io.Reader) error
	}{
		{"Read", func(r io.Reader) error { _, err := io.ReadAll(struct{ io.Reader }{r}); return err }},
		{"WriteTo", func(r io.Reader) error { _, err := r.(io.WriterTo).WriteTo(io.Discard); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := slots.NewLimiter(1)
			s, err := lim.TryAcquire()
			require.NoError(t, err)
			body := slots.WrapBody(&connBody{Reader: strings.NewReader("bye")}, s)
			require.NoError(t, tc.read(body))
			assert.Equal(t, 1, lim.InFlight(), "read to its end, but open")
			_, err = body.(io.Writer).Write([]byte("more"))
			require.NoError(t, err, "still writable")
			require.NoError(t, body.Close())
			assert.Equal(t, 0, lim.InFlight(), "freed by the Close")
		})
	}
}

// connBody is a connection's body: it reads r, takes writes, can be
// half-closed, and has WriteTo.
type connBody struct {
	*strings.Reader
	closed bool
}

func (c *connBody) Write(p []byte) (int, error) { return len(p), nil }
func (c *connBody) CloseWrite() error           { return nil }
func (c *connBody) Close() error                { c.closed = true; return nil }

// A body with Write but no CloseWrite is no connection: an *os.File (even
// opened read-only) read to its end frees its slot, as any body does, also
// when only the raw file is closed after (as exec.Cmd.Wait closes its
// pipes). Found by review: taking every body with Write for a connection
// held such a slot for good.
func TestFileBodyFreedAtItsEnd(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, []byte("a long answer"), 0o600))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	lim := slots.NewLimiter(1)
	s, err := lim.TryAcquire()
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, slots.WrapBody(f, s))
	require.NoError(t, err)
	assert.Equal(t, 0, lim.InFlight(), "read to its end: freed")
}
