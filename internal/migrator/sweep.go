package migrator

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ServerHashes is what one sweep of every API server's own discovery
// showed: per resource, the storageVersionHash each server publishes ("" for
// a server that does not list it). One sweep serves every built-in
// resource, since each group version's discovery document carries the
// hashes of all its resources.
type ServerHashes struct {
	// Hashes holds, per resource, one hash per server read.
	Hashes map[schema.GroupResource][]string
	// Servers is how many API servers were read.
	Servers int
	// Single: the census counts one API server, whose answers the caller's
	// own discovery read already holds.
	Single bool
	// Unseen says why not every API server was read; "" when each was.
	Unseen string
}

// Moved says whether any server read publishes another hash for gr than
// recorded, or does not list gr; always true when not every server was
// read (or none was, as in the zero value), since then nothing shows that
// none moved.
func (s ServerHashes) Moved(gr schema.GroupResource, recorded string) bool {
	switch {
	case s.Single:
		return false
	case s.Unseen != "", s.Servers == 0, len(s.Hashes[gr]) < s.Servers:
		return true
	}
	for _, h := range s.Hashes[gr] {
		if h != recorded {
			return true
		}
	}
	return false
}

// SweepServerHashes reads, at each API server's own address, the discovery
// document of every group version in groupVersions (one request each per
// server), after counting the servers as a pass does. With one server it
// reads nothing: the caller's read through the usual client reached it.
func (m *Migrator) SweepServerHashes(ctx context.Context, groupVersions []schema.GroupVersion) (ServerHashes, error) {
	bound, c, err := m.lagWait(ctx)
	if err != nil {
		return ServerHashes{}, err
	}
	if bound == 0 {
		return ServerHashes{Single: true}, nil
	}
	switch {
	case c.unseen != "":
		return ServerHashes{Unseen: c.unseen}, nil
	case len(c.addresses) == 0:
		return ServerHashes{Unseen: "restow has the address of no API server"}, nil
	case !m.verifiesServers():
		return ServerHashes{Unseen: m.canVerifyServers().Error()}, nil
	}
	out := ServerHashes{Hashes: map[schema.GroupResource][]string{}, Servers: len(c.addresses)}
	read := make([]map[schema.GroupResource]string, len(c.addresses))
	errs := make([]error, len(c.addresses))
	var wg sync.WaitGroup
	for i, address := range c.addresses {
		wg.Go(func() { read[i], errs[i] = m.sweepServer(ctx, address, groupVersions) })
	}
	wg.Wait()
	var unread []string
	for i, hashes := range read {
		if errs[i] != nil {
			unread = append(unread, fmt.Sprintf("%s cannot be read (%s)", c.addresses[i], Message(errs[i])))
			continue
		}
		for gr, h := range hashes {
			out.Hashes[gr] = append(out.Hashes[gr], h)
		}
	}
	if len(unread) > 0 {
		return ServerHashes{Unseen: strings.Join(unread, "; ")}, nil
	}
	// A resource one server lists and another does not counts "" for it.
	for gr, hashes := range out.Hashes {
		for len(hashes) < len(c.addresses) {
			hashes = append(hashes, "")
		}
		out.Hashes[gr] = hashes
	}
	return out, nil
}

// sweepServer reads the discovery documents of groupVersions at the API
// server at address: each resource's storageVersionHash.
func (m *Migrator) sweepServer(ctx context.Context, address string, groupVersions []schema.GroupVersion) (map[schema.GroupResource]string, error) {
	dc, err := m.serverDiscovery(address)
	if err != nil {
		return nil, err
	}
	hashes := map[schema.GroupResource]string{}
	for _, gv := range groupVersions {
		resources, err := groupVersionDocument(ctx, dc, gv)
		if err != nil {
			return nil, fmt.Errorf("reading the discovery of %s: %w", gv, err)
		}
		for _, r := range resources.APIResources {
			gr := schema.GroupResource{Group: gv.Group, Resource: r.Name}
			if strings.Contains(r.Name, "/") {
				continue
			}
			if _, seen := hashes[gr]; !seen || r.StorageVersionHash != "" {
				hashes[gr] = r.StorageVersionHash
			}
		}
	}
	return hashes, nil
}
