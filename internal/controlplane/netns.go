package controlplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// API servers on addresses of their own (Options.OwnAddresses).
//
// A production control plane's API servers each have an address of their
// own, which each publishes in the default/kubernetes Service's endpoints.
// kube-apiserver refuses to publish a loopback address, and tests here may
// send traffic only to loopback or into network namespaces they create
// themselves. So each API server runs in a network namespace of its own,
// joined to this host by a veth pair with a /30 of its own from
// 198.18.0.0/15 (RFC 2544's benchmarking range, which nothing routes): the
// host end holds the first address, the server the second. Nothing in the
// namespace routes anywhere else. Deleting the namespace deletes the pair.

// netnsPrefix names this package's network namespaces under /run/netns:
// netnsPrefix<pid>-<index>, so that a later run can remove those a killed
// test process left behind.
const netnsPrefix = "restow-"

// hostNetwork is one API server's network namespace and the veth pair to it.
type hostNetwork struct {
	name         string
	hostLink     string
	host, server net.IP
}

// benchmarkingBlocks is how many /30 blocks 198.18.0.0/15 holds.
const benchmarkingBlocks = 1 << 15

// blockAddresses returns the host's and the server's address in /30 block b
// of 198.18.0.0/15.
func blockAddresses(b int) (host, server net.IP) {
	base := 198<<24 | 18<<16 | uint32(b)*4
	ip := func(v uint32) net.IP { return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)) }
	return ip(base + 1), ip(base + 2)
}

// newHostNetwork creates the network namespace of API server index of this
// process, with its veth pair and addresses. The address block is the first
// free one from a place that depends on the process and the index, so that
// test binaries running side by side do not collide.
func newHostNetwork(index int) (*hostNetwork, error) {
	removeLeftNetworks()
	used, err := usedAddresses()
	if err != nil {
		return nil, err
	}
	start := (os.Getpid()*16 + index) % benchmarkingBlocks
	for i := range benchmarkingBlocks {
		b := (start + i) % benchmarkingBlocks
		host, server := blockAddresses(b)
		if used[host.String()] || used[server.String()] {
			continue
		}
		n := &hostNetwork{
			name:     fmt.Sprintf("%s%d-%d", netnsPrefix, os.Getpid(), index),
			hostLink: "rsw" + strconv.FormatInt(int64(b), 36) + "h",
			host:     host, server: server,
		}
		if err := n.create(strconv.FormatInt(int64(b), 36)); err != nil {
			return nil, errors.Join(err, n.close())
		}
		return n, nil
	}
	return nil, errors.New("no free /30 left in 198.18.0.0/15")
}

func usedAddresses() (map[string]bool, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing this host's addresses: %w", err)
	}
	used := map[string]bool{}
	for _, a := range addrs {
		used[a.IP.String()] = true
	}
	return used, nil
}

// create makes the namespace, the pair and the addresses. The calling
// goroutine stays on its thread while it switches namespaces, and is back
// in the host's when create returns.
func (n *hostNetwork) create(id string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hostNS, err := netns.Get()
	if err != nil {
		return err
	}
	defer func() { _ = hostNS.Close() }()
	ns, err := netns.NewNamed(n.name)
	if err != nil {
		return fmt.Errorf("creating network namespace %s (it needs root or CAP_NET_ADMIN): %w", n.name, err)
	}
	defer func() { _ = ns.Close() }()
	if err := netns.Set(hostNS); err != nil {
		return err
	}
	peer := "rsw" + id + "p"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.hostLink}, PeerName: peer, PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating veth pair %s: %w", n.hostLink, err)
	}
	if err := setUp(netlink.Handle{}, n.hostLink, n.host); err != nil {
		return err
	}
	inside, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer inside.Close()
	if err := setUp(*inside, peer, n.server); err != nil {
		return err
	}
	// The server's own loopback, which it uses to reach itself.
	return setUp(*inside, "lo", nil)
}

// setUp gives link addr (a /30) if addr is set, and brings it up.
func setUp(h netlink.Handle, name string, addr net.IP) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding link %s: %w", name, err)
	}
	if addr != nil {
		if err := h.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: addr, Mask: net.CIDRMask(30, 32)}}); err != nil {
			return fmt.Errorf("adding %s to %s: %w", addr, name, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing %s up: %w", name, err)
	}
	return nil
}

// close deletes the namespace, and with it the veth pair.
func (n *hostNetwork) close() error {
	var errs []error
	if link, err := netlink.LinkByName(n.hostLink); err == nil {
		errs = append(errs, netlink.LinkDel(link))
	}
	if err := netns.DeleteNamed(n.name); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("deleting network namespace %s: %w", n.name, err))
	}
	return errors.Join(errs...)
}

// removeLeftNetworks deletes the namespaces of this package's processes
// that are gone (a test binary killed before its cleanup).
func removeLeftNetworks() {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		pid, _, ok := strings.Cut(rest, "-")
		if _, err := strconv.Atoi(pid); !ok || err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", pid)); errors.Is(err, os.ErrNotExist) {
			_ = netns.DeleteNamed(e.Name())
		}
	}
}
