package controlplane

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
)

// watchMethod is etcd's Watch call: the stream whose answers a lagging API
// server receives late.
const watchMethod = "/etcdserverpb.Watch/Watch"

// lagProxy sits between one kube-apiserver and etcd and holds back the events
// of etcd's watches by a delay that can change at any time: that API server's
// watch caches and informers, its CRD informer above all, see every change
// late, as an overloaded API server's do, while its reads and writes go to
// etcd at once. (kube-apiserver's --etcd-servers-overrides would send only
// CRDs through the proxy, but the API server stores CRDs through options
// that ignore it.)
//
// It is a gRPC proxy: it ends the API server's calls and makes the same
// calls to etcd, passing every message through as bytes, and holds the
// messages etcd sends on Watch streams in a queue of their own, each until
// the delay since it arrived is over. Holding them at the level of HTTP/2
// frames instead would hold back the flow-control credit of the connection
// too: etcd would stop sending once a window of unread events was in
// flight, and the lag would grow without bound under a steady stream of
// writes (a cache a minute behind after a minute of writes, with a delay
// of 10 s), not stay at the delay that was set.
type lagProxy struct {
	listener net.Listener
	server   *grpc.Server
	upstream *grpc.ClientConn
	delay    atomic.Int64
	served   chan struct{}
}

// newLagProxy listens on a loopback port and relays each call to target, an
// etcd client address such as 127.0.0.1:2379 (plain gRPC, as envtest runs
// etcd).
func newLagProxy(target string) (*lagProxy, error) {
	return newLagProxyOn("127.0.0.1", target)
}

// newLagProxyOn is newLagProxy listening on host.
func newLagProxyOn(host, target string) (*lagProxy, error) {
	upstream, err := grpc.NewClient("passthrough:///"+target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodec(rawCodec{}),
			grpc.MaxCallRecvMsgSize(math.MaxInt32),
			grpc.MaxCallSendMsgSize(math.MaxInt32),
		),
	)
	if err != nil {
		return nil, err
	}
	listener, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, errors.Join(err, upstream.Close())
	}
	p := &lagProxy{listener: listener, upstream: upstream, served: make(chan struct{})}
	p.server = grpc.NewServer(
		grpc.UnknownServiceHandler(p.relay),
		grpc.ForceServerCodec(rawCodec{}),
		grpc.MaxRecvMsgSize(math.MaxInt32),
		grpc.MaxSendMsgSize(math.MaxInt32),
		// The API server's etcd client pings every 30 s, also when idle.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	)
	go func() {
		defer close(p.served)
		_ = p.server.Serve(listener)
	}()
	return p, nil
}

// addr is the proxy's address, host:port.
func (p *lagProxy) addr() string { return p.listener.Addr().String() }

// close ends every call and the connection to etcd.
func (p *lagProxy) close() error {
	p.server.Stop()
	<-p.served
	return p.upstream.Close()
}

// setDelay sets how long watch events are held back from now on. Events
// already held keep their time, and none overtakes another.
func (p *lagProxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

// relay makes the call the API server made (any method, as a stream both
// ways) to etcd and copies the messages of each side to the other, with the
// request's metadata; etcd's answers on a Watch stream arrive late.
func (p *lagProxy) relay(_ any, down grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(down)
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	md, _ := metadata.FromIncomingContext(ctx)
	up, err := p.upstream.NewStream(metadata.NewOutgoingContext(ctx, md.Copy()),
		&grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		return err
	}
	go func() {
		for {
			m := new(rawMessage)
			if err := down.RecvMsg(m); err != nil {
				if errors.Is(err, io.EOF) {
					_ = up.CloseSend()
				} else {
					cancel()
				}
				return
			}
			if err := up.SendMsg(m); err != nil {
				return // RecvMsg on up returns the reason
			}
		}
	}()
	var lag *lagQueue
	if method == watchMethod {
		lag = newLagQueue(&p.delay)
		go lag.send(ctx, down)
	}
	for {
		m := new(rawMessage)
		err := up.RecvMsg(m)
		if err != nil {
			if lag != nil {
				// What etcd sent before it ended the stream comes first.
				if sendErr := lag.end(); sendErr != nil {
					return sendErr
				}
			}
			down.SetTrailer(up.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if lag != nil {
			lag.push(m)
			continue
		}
		if err := down.SendMsg(m); err != nil {
			return err
		}
	}
}

// lagQueue holds the messages of one watch stream until each is due.
type lagQueue struct {
	delay *atomic.Int64

	mu      sync.Mutex
	held    []heldMessage
	last    time.Time
	ended   bool
	arrived chan struct{} // a message was pushed, or the stream ended
	done    chan error    // send's end: nil, or why a message could not be sent
}

type heldMessage struct {
	m   *rawMessage
	due time.Time
}

func newLagQueue(delay *atomic.Int64) *lagQueue {
	return &lagQueue{delay: delay, arrived: make(chan struct{}, 1), done: make(chan error, 1)}
}

// push holds m for the delay as it is now, and never less than the message
// before it.
func (q *lagQueue) push(m *rawMessage) {
	q.mu.Lock()
	due := time.Now().Add(time.Duration(q.delay.Load()))
	if due.Before(q.last) {
		due = q.last // in order, also when the delay shrinks
	}
	q.last = due
	q.held = append(q.held, heldMessage{m: m, due: due})
	q.mu.Unlock()
	q.wake()
}

// end waits until every held message was sent, and reports why not.
func (q *lagQueue) end() error {
	q.mu.Lock()
	q.ended = true
	q.mu.Unlock()
	q.wake()
	return <-q.done
}

func (q *lagQueue) wake() {
	select {
	case q.arrived <- struct{}{}:
	default:
	}
}

// send sends each held message to down when it is due, until the stream
// ends and nothing is held.
func (q *lagQueue) send(ctx context.Context, down grpc.ServerStream) {
	for {
		q.mu.Lock()
		if len(q.held) == 0 {
			ended := q.ended
			q.mu.Unlock()
			if ended {
				q.done <- nil
				return
			}
			select {
			case <-q.arrived:
				continue
			case <-ctx.Done():
				q.done <- ctx.Err()
				return
			}
		}
		next := q.held[0]
		q.held[0] = heldMessage{}
		q.held = q.held[1:]
		q.mu.Unlock()
		select {
		case <-time.After(time.Until(next.due)):
		case <-ctx.Done():
			q.done <- ctx.Err()
			return
		}
		if err := down.SendMsg(next.m); err != nil {
			q.done <- err
			return
		}
	}
}

// rawMessage is a gRPC message as bytes, passed through unread.
type rawMessage struct{ data []byte }

// rawCodec marshals a rawMessage as its bytes: the proxy needs no etcd types.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.(*rawMessage).data, nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	v.(*rawMessage).data = append([]byte(nil), data...)
	return nil
}

// Name is the content subtype the API server's etcd client asks for.
func (rawCodec) Name() string { return "proto" }
