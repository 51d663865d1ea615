// Package svm speaks the standard StorageVersionMigration API
// (storagemigration.k8s.io, v1 since Kubernetes 1.37, v1beta1 in 1.35 and
// 1.36): which version a cluster serves, the migrations of a resource and
// their state. restow reads them to live beside the in-tree controller, and
// optionally serves them itself (controllers/storageversionmigration_controller.go).
//
// Both versions have the same fields, so the objects are handled as
// unstructured objects of whichever version is served and converted into the
// v1 Go types.
package svm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Group is the API group of the standard StorageVersionMigration.
const Group = "storagemigration.k8s.io"

// Kind and Resource of the standard StorageVersionMigration.
const (
	Kind     = "StorageVersionMigration"
	Resource = "storageversionmigrations"
)

// versions are the versions restow speaks, preferred first. v1alpha1 (1.30
// to 1.34) had other fields and is not read.
var versions = []string{"v1", "v1beta1"}

// ServedVersion returns the version of the standard API that the cluster
// serves, "v1" before "v1beta1", or "" if it serves neither.
func ServedVersion(disco discovery.ServerResourcesInterface) (string, error) {
	for _, v := range versions {
		resources, err := disco.ServerResourcesForGroupVersion(schema.GroupVersion{Group: Group, Version: v}.String())
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return "", fmt.Errorf("discovering %s/%s: %w", Group, v, err)
		}
		if slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == Resource }) {
			return v, nil
		}
	}
	return "", nil
}

// GVK is the kind of the standard StorageVersionMigration at version.
func GVK(version string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: Group, Version: version, Kind: Kind}
}

// New returns an empty unstructured StorageVersionMigration of version, for
// a client's Get or a watch.
func New(version string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(GVK(version))
	return u
}

// NewList returns an empty unstructured list of StorageVersionMigrations of version.
func NewList(version string) *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(GVK(version).GroupVersion().WithKind(Kind + "List"))
	return l
}

// FromUnstructured converts a StorageVersionMigration of either version
// into the v1 types.
func FromUnstructured(u *unstructured.Unstructured) (*svmv1.StorageVersionMigration, error) {
	out := &svmv1.StorageVersionMigration{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return nil, fmt.Errorf("reading StorageVersionMigration %s: %w", u.GetName(), err)
	}
	return out, nil
}

// ToUnstructured converts a StorageVersionMigration into an unstructured
// object of version, for a write.
func ToUnstructured(m *svmv1.StorageVersionMigration, version string) (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(m)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(GVK(version))
	return u, nil
}

// State is where a StorageVersionMigration stands, from its conditions.
type State string

const (
	// Pending is a migration nobody has started yet (no Running, Succeeded
	// or Failed condition is true).
	Pending State = "Pending"
	// Running is a migration a controller is carrying out.
	Running State = "Running"
	// Succeeded is a migration that ended with every object migrated. It is
	// final: a StorageVersionMigration runs once.
	Succeeded State = "Succeeded"
	// Failed is a migration that ended without migrating every object; final too.
	Failed State = "Failed"
)

// StateOf reads the state of m from its conditions. Succeeded and Failed
// win over Running: the in-tree controller sets Running back to false only
// after it has recorded the end.
func StateOf(m *svmv1.StorageVersionMigration) State {
	switch {
	case meta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationSucceeded)):
		return Succeeded
	case meta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationFailed)):
		return Failed
	case meta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationRunning)):
		return Running
	}
	return Pending
}

// Final reports whether s is an end: the migration rewrites nothing more.
func (s State) Final() bool { return s == Succeeded || s == Failed }

// Over reports whether m's controller is done with it: it ended, and
// Running is no longer true. The in-tree controller records the end first
// and only then, in a later step, prunes the CRD's status.storedVersions and
// sets Running to false; a migration that Succeeded with Running still true
// is about to prune.
func Over(m *svmv1.StorageVersionMigration) bool {
	return StateOf(m).Final() && !meta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationRunning))
}

// Migration is what restow shows of a standard StorageVersionMigration.
type Migration struct {
	Name  string
	State State
	// Over says its controller is done with it (see Over).
	Over    bool
	Created time.Time
	// Message is the message of the condition that gives the state, if any.
	Message string
}

// Summarize is what restow shows of m.
func Summarize(m *svmv1.StorageVersionMigration) Migration {
	s := StateOf(m)
	out := Migration{Name: m.Name, State: s, Over: Over(m), Created: m.CreationTimestamp.Time}
	if c := meta.FindStatusCondition(m.Status.Conditions, string(s)); c != nil {
		out.Message = c.Message
	}
	return out
}

// ErrNotServed is returned by ForResource when the cluster serves no
// version of the standard API.
var ErrNotServed = errors.New("the cluster serves no storagemigration.k8s.io StorageVersionMigration API")

// ForResource lists the StorageVersionMigrations of version whose resource
// is gr, oldest first (the order in which the in-tree controller runs them).
// An empty version returns ErrNotServed.
func ForResource(ctx context.Context, reader client.Reader, version string, gr schema.GroupResource) ([]*svmv1.StorageVersionMigration, error) {
	if version == "" {
		return nil, ErrNotServed
	}
	list := NewList(version)
	if err := reader.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing %s %s: %w", Group, Resource, err)
	}
	var out []*svmv1.StorageVersionMigration
	for i := range list.Items {
		m, err := FromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		if m.Spec.Resource.Group == gr.Group && m.Spec.Resource.Resource == gr.Resource {
			out = append(out, m)
		}
	}
	SortOldestFirst(out)
	return out, nil
}

// SortOldestFirst orders migrations by creation time, then name: the order
// in which the in-tree controller takes the migrations of one resource.
func SortOldestFirst(ms []*svmv1.StorageVersionMigration) {
	slices.SortFunc(ms, func(a, b *svmv1.StorageVersionMigration) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
}

// Active returns the first of ms that is not at its end, or nil.
func Active(ms []*svmv1.StorageVersionMigration) *svmv1.StorageVersionMigration {
	for _, m := range ms {
		if !StateOf(m).Final() {
			return m
		}
	}
	return nil
}
