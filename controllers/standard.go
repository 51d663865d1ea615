package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/svm"
)

// StandardMigrations reads the standard StorageVersionMigrations
// (storagemigration.k8s.io) of the cluster: restow shows them beside its own
// migrations, and the automatic trigger leaves a resource that one of them
// is migrating to it. A nil *StandardMigrations (the cluster serves no such
// API) reads none.
type StandardMigrations struct {
	// Version is the served version, v1 or v1beta1.
	Version string
	// Reader lists them; the manager's cache, so that a reconcile costs no request.
	Reader client.Reader
	// Served says that restow serves them itself (--serve-storage-version-migrations).
	Served bool
}

// maxShownStandard bounds status.storageVersionMigrations.
const maxShownStandard = 10

// forResource lists the StorageVersionMigrations of gr, oldest first.
func (s *StandardMigrations) forResource(ctx context.Context, gr schema.GroupResource) ([]svm.Migration, error) {
	if s == nil {
		return nil, nil
	}
	all, err := svm.ForResource(ctx, s.Reader, s.Version, gr)
	if err != nil {
		return nil, err
	}
	out := make([]svm.Migration, 0, len(all))
	for _, m := range all {
		out = append(out, svm.Summarize(m))
	}
	return out, nil
}

// active returns the oldest StorageVersionMigration of gr whose controller
// is not done with it (see svm.Over), or nil.
func (s *StandardMigrations) active(ctx context.Context, gr schema.GroupResource) (*svm.Migration, error) {
	all, err := s.forResource(ctx, gr)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if !all[i].Over {
			return &all[i], nil
		}
	}
	return nil, nil
}

// standardResource is the resource a StorageVersionMigration (unstructured,
// from a watch) names, as group and resource: also the name of its CRD.
func standardResource(o client.Object) schema.GroupResource {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return schema.GroupResource{}
	}
	group, _, _ := unstructured.NestedString(u.Object, "spec", "resource", "group")
	resource, _, _ := unstructured.NestedString(u.Object, "spec", "resource", "resource")
	return schema.GroupResource{Group: group, Resource: resource}
}

// standardStateChanged passes the creates and deletes of
// StorageVersionMigrations, and the updates that change their state: not
// the progress a controller writes into their conditions' messages.
var standardStateChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool { return standardState(e.ObjectOld) != standardState(e.ObjectNew) },
}

// standardState is a StorageVersionMigration's state, and whether its
// controller is done with it.
func standardState(o client.Object) string {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return ""
	}
	m, err := svm.FromUnstructured(u)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%s/%t", svm.StateOf(m), svm.Over(m))
}

// statusStandard is status.storageVersionMigrations for ms: the newest
// maxShownStandard, oldest first.
func statusStandard(ms []svm.Migration) []migrationv1alpha1.StandardMigration {
	if len(ms) > maxShownStandard {
		ms = ms[len(ms)-maxShownStandard:]
	}
	if len(ms) == 0 {
		return nil
	}
	out := make([]migrationv1alpha1.StandardMigration, 0, len(ms))
	for _, m := range ms {
		out = append(out, migrationv1alpha1.StandardMigration{Name: m.Name, State: string(m.State)})
	}
	return out
}
