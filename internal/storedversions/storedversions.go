// Package storedversions owns the CRD-facing decisions of a migration: which
// version a CRD stores at, whether the API server has switched to it yet, and
// pruning status.storedVersions safely (on a live read, with an optimistic
// lock, only while nothing changed since the pass began).
package storedversions

import (
	"context"
	"errors"
	"fmt"
	"slices"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/endpoints/discovery"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StorageVersion returns the version a CRD stores new writes at, or "".
func StorageVersion(crd *apiextensionsv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return ""
}

// ServedVersions returns the versions a CRD serves, in spec order.
func ServedVersions(crd *apiextensionsv1.CustomResourceDefinition) []string {
	var served []string
	for _, v := range crd.Spec.Versions {
		if v.Served {
			served = append(served, v.Name)
		}
	}
	return served
}

// NeedsMigration reports whether a CRD's status.storedVersions lists anything
// but its storage version: objects may still be stored at another version.
func NeedsMigration(crd *apiextensionsv1.CustomResourceDefinition) bool {
	storage := StorageVersion(crd)
	return storage != "" && !slices.Equal(crd.Status.StoredVersions, []string{storage})
}

// NotServingStorageVersion says why the API server does not yet store writes
// to the CRD's resource at its storage version, or returns "" when it does:
// the CRD is established and discovery lists the resource under every served
// version with the storage version hash of the current storage version.
// Discovery and the handler that stores objects follow the same CRD informer,
// and discovery is the later of the two to update.
func NotServingStorageVersion(disco clientdiscovery.DiscoveryInterface, crd *apiextensionsv1.CustomResourceDefinition) (string, error) {
	if !established(crd) {
		return "the CRD is not established", nil
	}
	storage := StorageVersion(crd)
	wantHash := discovery.StorageVersionHash(crd.Spec.Group, storage, crd.Spec.Names.Kind)
	for _, version := range ServedVersions(crd) {
		resources, err := disco.ServerResourcesForGroupVersion(crd.Spec.Group + "/" + version)
		if err != nil {
			return fmt.Sprintf("discovery does not serve %s/%s yet", crd.Spec.Group, version), client.IgnoreNotFound(err)
		}
		i := slices.IndexFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == crd.Spec.Names.Plural })
		if i < 0 {
			return fmt.Sprintf("discovery does not list %s in %s/%s yet", crd.Spec.Names.Plural, crd.Spec.Group, version), nil
		}
		if resources.APIResources[i].StorageVersionHash != wantHash {
			return fmt.Sprintf("the API server does not store %s at %s yet", crd.Name, storage), nil
		}
	}
	return "", nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// ErrCRDChanged means the CRD changed since the pass began (another storage
// version, spec or identity), so the pass proves nothing about the current
// storage version and a new pass must run before pruning.
var ErrCRDChanged = errors.New("the CRD changed since the pass began")

// Expected is the CRD a pass ran on: its name and UID, its storage version
// and metadata.generation when the pass started.
type Expected struct {
	Name           string
	UID            types.UID
	StorageVersion string
	Generation     int64
	// Kept, if set, decides for a live read of the CRD whether it is the
	// CRD the pass ran on, at its storage version in every state since the
	// pass started (the migration watched it): a generation that moved
	// without a change of storage version then proves nothing against the
	// pass. Without it, the generation must not have moved.
	Kept func(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) bool
}

// kept reports whether crd is the CRD want describes, not being deleted, by
// Kept or the generation.
func (want Expected) kept(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) bool {
	if crd.UID != want.UID || !crd.DeletionTimestamp.IsZero() || StorageVersion(crd) != want.StorageVersion {
		return false
	}
	if want.Kept != nil {
		return want.Kept(ctx, crd)
	}
	return crd.Generation == want.Generation
}

// Prune trims a CRD's status.storedVersions to [want.StorageVersion],
// provided that a live read shows the same CRD (UID) with the same storage
// version and metadata.generation (its spec did not change since the pass
// started), or, with want.Kept, a CRD that kept its storage version
// throughout. The write carries the read's resourceVersion, so a concurrent
// change fails it rather than being overwritten; then the CRD is read and
// judged again, so a finished pass is not thrown away for a write that
// came between. It returns the versions it removed.
func Prune(ctx context.Context, c client.Client, reader client.Reader, want Expected) ([]string, error) {
	var pruned []string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pruned = nil
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := reader.Get(ctx, client.ObjectKey{Name: want.Name}, crd); err != nil {
			return err
		}
		if !want.kept(ctx, crd) {
			return ErrCRDChanged
		}
		if slices.Equal(crd.Status.StoredVersions, []string{want.StorageVersion}) {
			return nil
		}
		for _, v := range crd.Status.StoredVersions {
			if v != want.StorageVersion {
				pruned = append(pruned, v)
			}
		}
		original := crd.DeepCopy()
		crd.Status.StoredVersions = []string{want.StorageVersion}
		return c.Status().Patch(ctx, crd, client.MergeFromWithOptions(original, client.MergeFromWithOptimisticLock{}))
	})
	switch {
	case errors.Is(err, ErrCRDChanged):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("pruning status.storedVersions of %s: %w", want.Name, err)
	}
	return pruned, nil
}
