// Package v1alpha1 holds the StorageMigration API of the migration.restow.dev group.
// It depends only on k8s.io/apimachinery, so it is cheap to import.
// +kubebuilder:object:generate=true
// +groupName=migration.restow.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "migration.restow.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &StorageMigration{}, &StorageMigrationList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
