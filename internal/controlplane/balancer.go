package controlplane

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// relay accepts TCP connections on a port of one of this host's addresses
// (loopback, or the host end of an API server's veth pair, netns.go) and
// hands each to handle; close ends the listener and every connection it
// tracks.
type relay struct {
	listener net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// listenRelayOn starts a relay on a free port of host.
func listenRelayOn(host string, handle func(*relay, net.Conn)) (*relay, error) {
	listener, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	r := &relay{listener: listener, conns: map[net.Conn]struct{}{}}
	r.wg.Go(func() {
		for {
			c, err := listener.Accept()
			if err != nil || !r.track(c) {
				return
			}
			r.wg.Go(func() {
				defer r.untrack(c)
				handle(r, c)
			})
		}
	})
	return r, nil
}

// addr is the relay's address, host:port.
func (r *relay) addr() string { return r.listener.Addr().String() }

func (r *relay) close() error {
	r.mu.Lock()
	r.closed = true
	err := r.listener.Close()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return err
}

// dial connects to target, tracked like an accepted connection.
func (r *relay) dial(target string) (net.Conn, error) {
	c, err := net.Dial("tcp", target)
	if err != nil {
		return nil, err
	}
	if !r.track(c) {
		return nil, net.ErrClosed
	}
	return c, nil
}

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	_ = c.Close()
}

// pipe copies both ways between client and server until either side ends,
// server's bytes through fromServer.
func pipe(client, server net.Conn, fromServer func(client, server net.Conn)) {
	var both sync.WaitGroup
	both.Go(func() {
		_, _ = io.Copy(server, client)
		_ = server.Close()
	})
	both.Go(func() {
		fromServer(client, server)
		_ = client.Close()
	})
	both.Wait()
}

// newBalancer starts a TCP load balancer on loopback in front of several API
// servers, as a cloud load balancer in front of a control plane: it hands
// each new connection to the next server in turn and never looks inside (TLS
// ends at the API server). A client keeps its connection, and so its server,
// until either end closes it: the API servers' --goaway-chance makes clients
// move.
func newBalancer(backends []string) (*relay, error) {
	return newBalancerOn("127.0.0.1", backends)
}

// newBalancerOn is newBalancer listening on host; with one backend it is a
// plain forwarder (etcd's client port, for an API server in a network
// namespace of its own).
func newBalancerOn(host string, backends []string) (*relay, error) {
	var next atomic.Uint64
	return listenRelayOn(host, func(r *relay, client net.Conn) {
		server, err := r.dial(backends[(next.Add(1)-1)%uint64(len(backends))])
		if err != nil {
			return // the client sees its connection closed, as behind a balancer whose backend is down
		}
		defer r.untrack(server)
		pipe(client, server, func(client, server net.Conn) { _, _ = io.Copy(client, server) })
	})
}
