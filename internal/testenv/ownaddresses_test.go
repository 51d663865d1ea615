package testenv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/restow/restow/internal/testenv"
)

// TestAPIServersOnAddressesOfTheirOwn starts two API servers, each in a
// network namespace of its own, and checks what a client in the cluster
// sees, as on a production control plane: both addresses in the
// default/kubernetes Service's EndpointSlices, an identity Lease for each
// and none for the retired bootstrap server, and at each address a server
// whose certificate the cluster's CA verifies under the Service's name.
func TestAPIServersOnAddressesOfTheirOwn(t *testing.T) {
	// Registered first, so it runs after the control plane stopped: it
	// leaves no network namespace behind.
	t.Cleanup(func() {
		for i := range 2 {
			name := "restow-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(i)
			if _, err := os.Stat("/run/netns/" + name); err == nil {
				t.Errorf("network namespace %s left behind", name)
			}
		}
	})
	cp := testenv.Start(t, testenv.Options{APIServers: 2, OwnAddresses: true})

	var hostnames, addresses []string
	testenv.WaitProgress(t, "both servers' addresses in default/kubernetes", time.Minute, func(ctx context.Context) (bool, string, error) {
		var err error
		hostnames, addresses, err = cp.APIServerSignals(ctx)
		return len(addresses) == 2, fmt.Sprintf("Leases of %v, addresses %v", hostnames, addresses), err
	})
	t.Logf("default/kubernetes's endpoints: %v", addresses)
	if want := []string{"restow-apiserver-0", "restow-apiserver-1"}; !slices.Equal(hostnames, want) {
		t.Errorf("identity Leases of %v, want %v", hostnames, want)
	}

	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cp.Config.CAData) {
		t.Fatal("no CA in the control plane's configuration")
	}
	// Every server listens on one port, the kubernetes Service's.
	server, err := url.Parse(cp.ServerConfig(0).Host)
	if err != nil {
		t.Fatal(err)
	}
	for _, address := range addresses {
		dialer := &net.Dialer{Timeout: 5 * time.Second}
		conn, err := tls.DialWithDialer(dialer, "tcp", net.JoinHostPort(address, server.Port()), &tls.Config{RootCAs: pool, ServerName: "kubernetes.default.svc", MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Errorf("%s: %v", address, err)
			continue
		}
		_ = conn.Close()
	}
}
