package cli

import "google.golang.org/grpc"

// SetEtcdDialOptions adds gRPC dial options to verify's etcd client until
// the returned function is called.
func SetEtcdDialOptions(opts ...grpc.DialOption) (restore func()) {
	etcdDialOptions = opts
	return func() { etcdDialOptions = nil }
}
