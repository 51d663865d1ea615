package controllers

import (
	"k8s.io/client-go/discovery"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/restow/restow/internal/migrator"
)

// NewMigrator builds a migrator on a manager's configuration. Its reads are
// uncached: CRDs through the API reader, objects in pages, as metadata or
// whole (on a connection of their own, whose 429 answers slow every pass
// down at once), discovery without a cache.
func NewMigrator(mgr ctrl.Manager) (*migrator.Migrator, error) {
	cfg := mgr.GetConfig()
	meta, objects, throttle, err := migrator.ThrottledClients(cfg)
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
		Objects:   objects,
		Discovery: disco,
		Mapper:    mgr.GetRESTMapper(),
		Throttle:  throttle,
		Config:    cfg,
	}, nil
}
