package cli

import (
	"net/http"

	"google.golang.org/grpc"
)

// SetEtcdDialOptions adds gRPC dial options to verify's etcd client until
// the returned function is called.
func SetEtcdDialOptions(opts ...grpc.DialOption) (restore func()) {
	etcdDialOptions = opts
	return func() { etcdDialOptions = nil }
}

// SetWrapTransport wraps the transport of every API client a command makes
// until the returned function is called.
func SetWrapTransport(wrap func(http.RoundTripper) http.RoundTripper) (restore func()) {
	wrapTransport = wrap
	return func() { wrapTransport = nil }
}
