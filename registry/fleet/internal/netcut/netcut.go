// Package netcut cuts the network between a test's clients and a server
// on loopback: a proxy whose connections the test closes at will.
package netcut

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a loopback port of its own to a
// server, so that a test can cut the network between a client and the
// server: Cut closes every connection and, until Heal, closes each new one
// as soon as it is accepted, as a peer that resets them would. Both ends
// see their connections fail at once; the server runs on.
type Proxy struct {
	Addr string
	to   string
	ln   net.Listener
	wg   sync.WaitGroup

	mu    sync.Mutex // protects the fields below
	cut   bool
	conns map[net.Conn]bool // both ends of every forwarded connection: lost (Blackhole)
}

// Start starts a Proxy to the server at the address to, stopped at the
// test's cleanup.
func Start(t testing.TB, to string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("netcut: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), to: to, ln: ln, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Cut closes every forwarded connection, and every new one until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// Heal forwards new connections again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.to, time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.cut { // cut while dialling
			p.mu.Unlock()
			in.Close()
			out.Close()
			continue
		}
		p.conns[in], p.conns[out] = false, false
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// Blackhole loses every connection open now, without a word: their bytes
// are read and dropped, both ways, and they stay open, as when a peer's
// host goes or a firewall drops the packets; a reader on them waits for
// ever. New connections are forwarded as usual.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		p.conns[c] = true
	}
}

func (p *Proxy) lost(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[c]
}

// pipe copies from src to dst until either fails, then closes both. The
// bytes of a lost connection are dropped, and so is its end: a close on
// one side does not reach the other (Cut or the proxy's close ends it).
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		lost := p.lost(src)
		if n > 0 && !lost {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			if lost {
				return
			}
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *Proxy) close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
