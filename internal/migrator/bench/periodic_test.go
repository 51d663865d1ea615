package bench

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// byteCounter counts the requests a client sends and the bytes of the
// bodies it reads back.
type byteCounter struct {
	requests, bytes atomic.Int64
}

func (c *byteCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		c.requests.Add(1)
		resp, err := rt.RoundTrip(r)
		if err == nil {
			resp.Body = countedBody{ReadCloser: resp.Body, n: &c.bytes}
		}
		return resp, err
	})
}

func (c *byteCounter) take() (requests, bytes int64) {
	return c.requests.Swap(0), c.bytes.Swap(0)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// BenchmarkPeriodicReads measures what each read restow repeats costs, in
// requests and bytes read, on three API servers on addresses of their own:
// the trigger of built-in resources' discovery read and sweep of every
// server (each --builtin-discovery-interval, and on a Lease change), one
// look of a pass waiting for the servers to switch (every 250 ms while it
// waits), one resolve of a built-in resource (each look while the servers
// disagree, as through a rolling upgrade) and one read of every server's
// encryption state (each --encryption-check-interval for a resource in
// --reencrypt-resources).
func BenchmarkPeriodicReads(b *testing.B) {
	ha := testenv.Start(b, testenv.Options{
		CRDDirectoryPaths: []string{"../../../config/crd/bases"},
		APIServers:        3,
		OwnAddresses:      true,
	})
	ctx := b.Context()
	ha.WaitForSignals(b, 3, 3)
	counter := &byteCounter{}
	cfg := rest.CopyConfig(ha.Config)
	cfg.Wrap(counter.wrap)
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	m, err := migrator.NewForConfig(cfg, c)
	if err != nil {
		b.Fatal(err)
	}
	secrets := schema.GroupResource{Resource: "secrets"}
	var out strings.Builder
	measure := func(name, unit string, read func() error) {
		counter.take()
		if err := read(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		requests, bytes := counter.take()
		b.ReportMetric(float64(requests), name+"-requests")
		b.ReportMetric(float64(bytes)/1024, name+"-KiB")
		fmt.Fprintf(&out, "%-34s %5d requests %9.1f KiB  %s\n", name, requests, float64(bytes)/1024, unit)
	}
	var groupVersions []schema.GroupVersion
	measure("trigger-discovery", "each period: groups and every group version's document, through the usual client", func() error {
		groups, err := m.Discovery.ServerGroups()
		if err != nil {
			return err
		}
		for _, g := range groups.Groups {
			for _, v := range g.Versions {
				if _, err := m.Discovery.ServerResourcesForGroupVersion(v.GroupVersion); err != nil {
					return err
				}
				groupVersions = append(groupVersions, schema.GroupVersion{Group: g.Name, Version: v.Version})
			}
		}
		return nil
	})
	measure("trigger-sweep", "each period: the census and every group version at each server", func() error {
		s, err := m.SweepServerHashes(ctx, groupVersions)
		if err == nil && (s.Unseen != "" || s.Single) {
			err = fmt.Errorf("the sweep read not every server: %+v", s)
		}
		return err
	})
	measure("census", "the count of servers alone (Leases, EndpointSlices)", func() error {
		_, err := m.SweepServerHashes(ctx, nil)
		return err
	})
	measure("census-and-one-group-version", "a waiting pass's look is this less the census, every 250 ms", func() error {
		_, err := m.SweepServerHashes(ctx, []schema.GroupVersion{{Version: "v1"}})
		return err
	})
	measure("resolve-builtin", "each look of a built-in resource while the servers disagree", func() error {
		_, err := m.Resolve(ctx, secrets)
		return err
	})
	m.ReEncrypt = []schema.GroupResource{secrets}
	measure("resolve-builtin-reencrypted", "each encryption check: this less resolve-builtin", func() error {
		_, err := m.Resolve(ctx, secrets)
		return err
	})
	fmt.Printf("\nBenchmarkPeriodicReads, three API servers:\n%s", out.String())
}
