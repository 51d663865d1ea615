package controllers

import (
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/restow/restow/internal/migrator"
)

// NewMigrator builds a migrator on a manager's connection. Its reads are
// uncached: CRDs through the API reader, objects as metadata-only pages,
// discovery without a cache.
func NewMigrator(mgr ctrl.Manager) (*migrator.Migrator, error) {
	cfg := mgr.GetConfig()
	meta, err := metadata.NewForConfigAndClient(cfg, mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	return &migrator.Migrator{
		Client:    mgr.GetClient(),
		Reader:    mgr.GetAPIReader(),
		Metadata:  meta,
		Discovery: disco,
		Mapper:    mgr.GetRESTMapper(),
	}, nil
}
