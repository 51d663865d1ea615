package verify

import (
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// DefaultPrefix is kube-apiserver's default --etcd-prefix.
const DefaultPrefix = "/registry"

// specialKeys are the built-in resources kube-apiserver stores under a name
// of their own: its SpecialDefaultResourcePrefixes
// (pkg/kubeapiserver/default_storage_factory_builder.go, Kubernetes 1.37).
// Every other built-in resource is stored under its resource name alone,
// without its group (deployments.apps under /registry/deployments).
var specialKeys = map[schema.GroupResource]string{
	{Group: "", Resource: "replicationcontrollers"}:     "controllers",
	{Group: "", Resource: "endpoints"}:                  "services/endpoints",
	{Group: "", Resource: "nodes"}:                      "minions",
	{Group: "", Resource: "services"}:                   "services/specs",
	{Group: "extensions", Resource: "ingresses"}:        "ingress",
	{Group: "networking.k8s.io", Resource: "ingresses"}: "ingress",
}

// groupKeyed are the API groups whose resources are stored under
// <group>/<resource>: custom resources (see KeyPrefix's crd argument) and the
// built-in groups of kube-apiserver's apiextensions and aggregator servers.
var groupKeyed = map[string]bool{
	"apiextensions.k8s.io":   true,
	"apiregistration.k8s.io": true,
}

// KeyPrefix is the etcd key prefix, ending in "/", under which
// kube-apiserver stores a resource's objects: <prefix>/<group>/<resource>/
// for custom resources (crd true) and the apiextensions and aggregator
// groups, <prefix>/<resource>/ for other built-in resources, or the
// resource's special name (nodes under minions/). Objects follow as
// [<namespace>/]<name>.
func KeyPrefix(prefix string, gr schema.GroupResource, crd bool) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	var under string
	switch special, ok := specialKeys[gr]; {
	case crd || groupKeyed[gr.Group]:
		under = path.Join(gr.Group, gr.Resource)
	case ok:
		under = special
	default:
		under = strings.ToLower(gr.Resource)
	}
	return path.Join("/", prefix, under) + "/"
}

// ObjectName is the [<namespace>/]<name> part of a key under prefix.
func ObjectName(prefix, key string) string {
	return strings.TrimPrefix(key, prefix)
}
