package testenv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	ctx := testenv.Context(t, 2*time.Minute)

	var addresses []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list := &discoveryv1.EndpointSliceList{}
		if err := cp.Client.List(ctx, list, client.InNamespace(metav1.NamespaceDefault), client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes"}); err != nil {
			return false, err
		}
		addresses = nil
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				addresses = append(addresses, e.Addresses...)
			}
		}
		return len(addresses) == 2, nil
	})
	if err != nil {
		t.Fatalf("default/kubernetes's EndpointSlices list %v, want the 2 servers' addresses: %v", addresses, err)
	}
	t.Logf("default/kubernetes's endpoints: %v", addresses)

	leases := &coordinationv1.LeaseList{}
	if err := cp.Client.List(ctx, leases, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{"apiserver.kubernetes.io/identity": "kube-apiserver"}); err != nil {
		t.Fatal(err)
	}
	hostnames := make([]string, 0, len(leases.Items))
	for _, l := range leases.Items {
		hostnames = append(hostnames, l.Labels[corev1.LabelHostname])
	}
	slices.Sort(hostnames)
	if want := []string{"restow-apiserver-0", "restow-apiserver-1"}; !slices.Equal(hostnames, want) {
		t.Errorf("identity Leases of %v, want %v", hostnames, want)
	}

	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cp.Config.CAData) {
		t.Fatal("no CA in the control plane's configuration")
	}
	for _, address := range addresses {
		dialer := &net.Dialer{Timeout: 5 * time.Second}
		conn, err := tls.DialWithDialer(dialer, "tcp", net.JoinHostPort(address, "6443"), &tls.Config{RootCAs: pool, ServerName: "kubernetes.default.svc", MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Errorf("%s: %v", address, err)
			continue
		}
		_ = conn.Close()
	}
}
