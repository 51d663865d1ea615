package controlplane

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
)

// lagProxy sits between one kube-apiserver and etcd and holds back the events
// of etcd's watches by a delay that can change at any time: that API server's
// watch caches and informers, its CRD informer above all, see every change
// late, as an overloaded API server's do, while its reads and writes go to
// etcd at once. (kube-apiserver's --etcd-servers-overrides would send only
// CRDs through the proxy, but the API server stores CRDs through options
// that ignore it.)
//
// etcd speaks gRPC, that is HTTP/2. The proxy reads the API server's frames
// to learn which streams are watches (their :path, from the HPACK-encoded
// headers) and forwards them unchanged. Of etcd's frames it holds back only
// the data frames of watch streams, in order, each until the delay since it
// arrived is over; everything else passes at once, so that keepalive pings,
// settings, flow control and every header block (whose HPACK state depends
// on their order) arrive as sent, and both ends see a valid connection.
type lagProxy struct {
	*relay
	delay atomic.Int64
}

// newLagProxy listens on a loopback port and forwards each connection to
// target, an etcd client address such as 127.0.0.1:2379.
func newLagProxy(target string) (*lagProxy, error) {
	p := &lagProxy{}
	r, err := listenRelay(func(r *relay, client net.Conn) {
		server, err := r.dial(target)
		if err != nil {
			return
		}
		defer r.untrack(server)
		var watches sync.Map // stream ID → true for watch streams
		var both sync.WaitGroup
		both.Go(func() {
			_ = forwardNotingWatches(server, client, &watches)
			_ = server.Close()
		})
		both.Go(func() {
			_ = p.holdBack(client, server, &watches)
			_ = client.Close()
		})
		both.Wait()
	})
	p.relay = r
	return p, err
}

// setDelay sets how long watch events are held back from now on. Events
// already held keep their time, and none overtakes another.
func (p *lagProxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

// HTTP/2 (RFC 9113, section 6).
const (
	clientPreface     = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	frameData         = 0x0
	frameHeaders      = 0x1
	frameContinuation = 0x9
	flagEndHeaders    = 0x4
	flagPadded        = 0x8
	flagPriority      = 0x20
)

type frame struct {
	header [9]byte
	raw    []byte // header and payload
}

func (f frame) kind() byte       { return f.header[3] }
func (f frame) flags() byte      { return f.header[4] }
func (f frame) streamID() uint32 { return binary.BigEndian.Uint32(f.header[5:9]) & 0x7fffffff }
func (f frame) payload() []byte  { return f.raw[9:] }

func readFrame(r io.Reader) (frame, error) {
	var f frame
	if _, err := io.ReadFull(r, f.header[:]); err != nil {
		return f, err
	}
	length := uint32(f.header[0])<<16 | uint32(binary.BigEndian.Uint16(f.header[1:3]))
	f.raw = make([]byte, 9+int(length))
	copy(f.raw, f.header[:])
	_, err := io.ReadFull(r, f.raw[9:])
	return f, err
}

// forwardNotingWatches copies the API server's side of the connection to
// etcd and marks in watches each stream whose :path is etcd's Watch.
func forwardNotingWatches(server, client net.Conn, watches *sync.Map) error {
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(client, preface); err != nil {
		return err
	}
	if _, err := server.Write(preface); err != nil {
		return err
	}
	var stream uint32
	decoder := hpack.NewDecoder(4096, func(h hpack.HeaderField) {
		if h.Name == ":path" && strings.HasPrefix(h.Value, "/etcdserverpb.Watch/") {
			watches.Store(stream, true)
		}
	})
	for {
		f, err := readFrame(client)
		if err != nil {
			return err
		}
		switch f.kind() {
		case frameHeaders, frameContinuation:
			stream = f.streamID()
			if _, err := decoder.Write(headerBlockFragment(f)); err != nil {
				return err
			}
			if f.flags()&flagEndHeaders != 0 {
				if err := decoder.Close(); err != nil {
					return err
				}
			}
		}
		if _, err := server.Write(f.raw); err != nil {
			return err
		}
	}
}

// headerBlockFragment is the HPACK bytes of a HEADERS or CONTINUATION frame,
// without padding and priority.
func headerBlockFragment(f frame) []byte {
	p := f.payload()
	if f.kind() != frameHeaders {
		return p
	}
	pad := 0
	if f.flags()&flagPadded != 0 && len(p) > 0 {
		pad = int(p[0])
		p = p[1:]
	}
	if f.flags()&flagPriority != 0 && len(p) >= 5 {
		p = p[5:]
	}
	if pad <= len(p) {
		p = p[:len(p)-pad]
	}
	return p
}

type heldFrame struct {
	raw []byte
	due time.Time
}

// holdBack copies etcd's frames from server to client: the data of watch
// streams after the delay, everything else at once.
func (p *lagProxy) holdBack(client, server net.Conn, watches *sync.Map) error {
	var writing sync.Mutex
	write := func(raw []byte) error {
		writing.Lock()
		defer writing.Unlock()
		_, err := client.Write(raw)
		return err
	}
	held := make(chan heldFrame, 1<<16)
	sent := make(chan error, 1)
	go func() {
		var err error
		for f := range held {
			if err != nil {
				continue // drain, so the reader never blocks on a dead client
			}
			time.Sleep(time.Until(f.due))
			err = write(f.raw)
		}
		sent <- err
	}()
	var last time.Time
	err := func() error {
		for {
			f, err := readFrame(server)
			if err != nil {
				return err
			}
			if _, watch := watches.Load(f.streamID()); f.kind() != frameData || !watch {
				if err := write(f.raw); err != nil {
					return err
				}
				continue
			}
			due := time.Now().Add(time.Duration(p.delay.Load()))
			if due.Before(last) {
				due = last // in order, also when the delay shrinks
			}
			last = due
			held <- heldFrame{raw: f.raw, due: due}
		}
	}()
	close(held)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return errors.Join(err, <-sent)
}
