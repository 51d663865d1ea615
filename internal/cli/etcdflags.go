package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/restow/restow/internal/migrator/quota"
	"github.com/restow/restow/internal/verify"
)

// minEtcdRequestBytes is the least --etcd-max-request-bytes verify takes: no
// object's stored value fits in less.
const minEtcdRequestBytes = 4096

// etcdFlags are the etcd client flags verify and preflight take, as
// etcdctl's, with the scan's prefix and value bound.
type etcdFlags struct {
	scan           verify.ScanOptions
	endpoints      []string
	cacert         string
	cert, key      string
	connectTimeout time.Duration
}

func (o *etcdFlags) add(flags *pflag.FlagSet) {
	flags.Int64Var(&o.scan.MaxValueBytes, "etcd-max-request-bytes", verify.DefaultMaxValueBytes, "etcd's --max-request-bytes: no stored value is larger, so a page of values stays within "+fmt.Sprint(verify.MaxPageBytes>>20)+" MiB.")
	flags.StringSliceVar(&o.endpoints, "etcd-endpoints", []string{"127.0.0.1:2379"}, "etcd's client URLs, as etcdctl's --endpoints.")
	flags.StringVar(&o.cacert, "etcd-cacert", "", "CA bundle that signed etcd's serving certificate, as etcdctl's --cacert.")
	flags.StringVar(&o.cert, "etcd-cert", "", "Client certificate for etcd, as etcdctl's --cert.")
	flags.StringVar(&o.key, "etcd-key", "", "Client certificate's key for etcd, as etcdctl's --key.")
	flags.StringVar(&o.scan.Prefix, "etcd-prefix", verify.DefaultPrefix, "The API server's --etcd-prefix.")
	flags.BoolVar(&o.scan.SharedEtcd, "etcd-shared", false, "This etcd holds other clusters' keys too, some under --etcd-prefix: accept more keys there than the API lists, the prefix proven by the first object the API lists being there at its own revision.")
	flags.DurationVar(&o.connectTimeout, "etcd-dial-timeout", 5*time.Second, "How long to wait for etcd to answer.")
}

func (o etcdFlags) validate() error {
	switch {
	case (o.cert == "") != (o.key == ""):
		return errors.New("--etcd-cert and --etcd-key go together")
	case len(o.endpoints) == 0:
		return errors.New("--etcd-endpoints is empty")
	}
	return errors.Join(
		// etcd takes no request below a few KiB; a page holds one value of
		// the most bytes at least.
		between("etcd-max-request-bytes", o.scan.MaxValueBytes, minEtcdRequestBytes, verify.MaxPageBytes),
		positive("etcd-dial-timeout", o.connectTimeout),
	)
}

// open dials etcd and checks that it answers and holds keys under the
// prefix; the caller closes it.
func (o etcdFlags) open(ctx context.Context) (*clientv3.Client, error) {
	etcd, err := o.dialEtcd()
	if err != nil {
		return nil, err
	}
	if err := o.reachable(ctx, etcd.KV); err != nil {
		_ = etcd.Close()
		return nil, err
	}
	return etcd, nil
}

// etcdDialOptions are added to the etcd client's gRPC dial options: the
// tests record every call it sends.
var etcdDialOptions []grpc.DialOption

// dialEtcd connects to etcd as etcdctl would with the same flags. The client
// is handed on as a verify.Reader: range reads only.
func (o etcdFlags) dialEtcd() (*clientv3.Client, error) {
	return o.access().Dial(etcdDialOptions...)
}

func (o etcdFlags) access() quota.Access {
	return quota.Access{Endpoints: o.endpoints, CACert: o.cacert, Cert: o.cert, Key: o.key, DialTimeout: o.connectTimeout}
}

// reachable reads the number of keys under the prefix, within
// --etcd-dial-timeout: an etcd that does not answer, or refuses the
// certificates, ends the command there rather than hanging the first scan,
// and a prefix under which etcd holds nothing is not the API server's.
func (o etcdFlags) reachable(ctx context.Context, etcd verify.Reader) error {
	ctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	prefix := strings.TrimSuffix(o.scan.Prefix, "/") + "/"
	resp, err := etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("etcd at %s did not answer a read of %s within %s: %w", strings.Join(o.endpoints, ","), prefix, o.connectTimeout, err)
	}
	if resp.Count == 0 {
		return &exitError{code: ExitUnaccounted, err: fmt.Errorf("etcd at %s holds no key under %s: that is not where this API server stores anything. Give --etcd-prefix the API server's --etcd-prefix (kube-apiserver's default is /registry; OpenShift's is /kubernetes.io), and --etcd-endpoints this cluster's etcd",
			strings.Join(o.endpoints, ","), prefix)}
	}
	return nil
}
