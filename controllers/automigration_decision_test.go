package controllers

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/svm"
)

func TestDecideAutoMigration(t *testing.T) {
	const uid = types.UID("crd-uid")
	crd := func(stored []string, mutate ...func(*apiextensionsv1.CustomResourceDefinition)) *apiextensionsv1.CustomResourceDefinition {
		c := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", UID: uid, Labels: map[string]string{"team": "shop"}},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "example.com",
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets"},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
					{Name: "v1beta1", Served: true},
					{Name: "v1", Served: true, Storage: true},
				},
			},
			Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: stored},
		}
		for _, m := range mutate {
			m(c)
		}
		return c
	}
	migration := func(name string, automatic bool, owner types.UID) *migrationv1alpha1.StorageMigration {
		sm := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if automatic {
			sm.Labels = map[string]string{migrationv1alpha1.AutomaticLabel: "true"}
		}
		if owner != "" {
			sm.OwnerReferences = []metav1.OwnerReference{{UID: owner, Name: "widgets.example.com"}}
		}
		return sm
	}
	switched := []string{"v1beta1", "v1"}
	running := &svm.Migration{Name: "widgets-v1", State: svm.Running}
	shop := labels.SelectorFromSet(labels.Set{"team": "shop"})
	tests := []struct {
		name        string
		crd         *apiextensionsv1.CustomResourceDefinition
		selector    labels.Selector
		covering    []*migrationv1alpha1.StorageMigration
		standard    *svm.Migration
		want        autoAction
		wantRetired []string
	}{
		{name: "storage switched, nothing covers it", crd: crd(switched), want: autoCreate},
		{name: "storage switched, selector matches", crd: crd(switched), selector: shop, want: autoCreate},
		{name: "storage switched, old version listed last", crd: crd([]string{"v1", "v1beta1"}), want: autoCreate},
		{name: "only the storage version stored", crd: crd([]string{"v1"}), want: autoNothing},
		{name: "stored versions not reported yet", crd: crd(nil), want: autoCreate},
		{name: "opted out", crd: crd(switched, func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Annotations = map[string]string{migrationv1alpha1.AutoMigrateAnnotation: "false"}
		}), want: autoNothing},
		{name: "annotation other than false does not opt out", crd: crd(switched, func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Annotations = map[string]string{migrationv1alpha1.AutoMigrateAnnotation: "true"}
		}), want: autoCreate},
		{name: "selector does not match", crd: crd(switched), selector: labels.SelectorFromSet(labels.Set{"team": "billing"}), want: autoNothing},
		{name: "being deleted", crd: crd(switched, func(c *apiextensionsv1.CustomResourceDefinition) {
			now := metav1.Now()
			c.DeletionTimestamp = &now
		}), want: autoNothing},
		{name: "user-made migration covers it", crd: crd(switched), covering: []*migrationv1alpha1.StorageMigration{migration("mine", false, "")}, want: autoNothing},
		{name: "automatic migration exists", crd: crd(switched), covering: []*migrationv1alpha1.StorageMigration{migration("widgets.example.com", true, uid)}, want: autoNothing},
		{name: "automatic and user-made: the automatic one retires", crd: crd(switched),
			covering: []*migrationv1alpha1.StorageMigration{migration("widgets.example.com", true, uid), migration("mine", false, "")},
			want:     autoRetire, wantRetired: []string{"widgets.example.com"}},
		{name: "retiring does not depend on opting in", crd: crd(switched, func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Annotations = map[string]string{migrationv1alpha1.AutoMigrateAnnotation: "false"}
		}),
			covering: []*migrationv1alpha1.StorageMigration{migration("mine", false, ""), migration("widgets.example.com", true, uid)},
			want:     autoRetire, wantRetired: []string{"widgets.example.com"}},
		{name: "labelled automatic but owned by another CRD counts as user-made", crd: crd(switched),
			covering: []*migrationv1alpha1.StorageMigration{migration("copied", true, "other-uid")}, want: autoNothing},
		{name: "two user-made migrations: none deleted", crd: crd(switched),
			covering: []*migrationv1alpha1.StorageMigration{migration("a", false, ""), migration("b", false, uid)}, want: autoNothing},
		{name: "a standard migration is migrating it: held back", crd: crd(switched), standard: running, want: autoHoldBack},
		{name: "a standard migration and nothing to migrate", crd: crd([]string{"v1"}), standard: running, want: autoNothing},
		{name: "a standard migration and opted out", crd: crd(switched, func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Annotations = map[string]string{migrationv1alpha1.AutoMigrateAnnotation: "false"}
		}), standard: running, want: autoNothing},
		{name: "a standard migration: the automatic one retires", crd: crd(switched), standard: running,
			covering: []*migrationv1alpha1.StorageMigration{migration("widgets.example.com", true, uid)},
			want:     autoRetire, wantRetired: []string{"widgets.example.com"}},
		{name: "a pending standard migration: the automatic one stays", crd: crd(switched), standard: &svm.Migration{Name: "widgets-v1", State: svm.Pending},
			covering: []*migrationv1alpha1.StorageMigration{migration("widgets.example.com", true, uid)}, want: autoNothing},
		{name: "a standard migration that succeeded but is not wound up: held back", crd: crd(switched),
			standard: &svm.Migration{Name: "widgets-v1", State: svm.Succeeded}, want: autoHoldBack},
		{name: "a pending standard migration: held back", crd: crd(switched), standard: &svm.Migration{Name: "widgets-v1", State: svm.Pending}, want: autoHoldBack},
		{name: "a standard migration and a user-made one: nothing deleted", crd: crd(switched), standard: running,
			covering: []*migrationv1alpha1.StorageMigration{migration("mine", false, "")}, want: autoNothing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decideAutoMigration(tt.crd, tt.selector, tt.covering, tt.standard)
			if d.action != tt.want {
				t.Fatalf("action = %d (%s), want %d", d.action, d.why, tt.want)
			}
			if d.why == "" {
				t.Error("no reason given")
			}
			var retired []string
			for _, sm := range d.retire {
				retired = append(retired, sm.Name)
			}
			if len(retired) != len(tt.wantRetired) || (len(retired) > 0 && retired[0] != tt.wantRetired[0]) {
				t.Errorf("retired %v, want %v", retired, tt.wantRetired)
			}
		})
	}
}
