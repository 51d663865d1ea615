package v1alpha1_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{CRDDirectoryPaths: []string{"../../config/crd/bases"}}, &env)
}

// TestValidation runs the generated CRD's schema and CEL rules in the real API server.
func TestValidation(t *testing.T) {
	tests := []struct {
		name      string
		spec      migrationv1alpha1.StorageMigrationSpec
		wantError string // empty: must be accepted
	}{
		{name: "crd", spec: spec("stable.example.com", "crontabs")},
		{name: "core group", spec: spec("", "secrets")},
		{name: "upper-case resource", spec: spec("stable.example.com", "CronTabs"), wantError: "resource must be a DNS label"},
		{name: "empty resource", spec: spec("stable.example.com", ""), wantError: "spec.resource.resource"},
		{name: "bad group", spec: spec("Stable_Example", "crontabs"), wantError: "group must be empty or a DNS subdomain"},
		{name: "zero concurrency", spec: withConcurrency(spec("a.b", "c"), 0), wantError: "spec.concurrency"},
		{name: "huge page size", spec: withPageSize(spec("a.b", "c"), 100000), wantError: "spec.pageSize"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testenv.Context(t, 30*time.Second)
			sm := &migrationv1alpha1.StorageMigration{
				ObjectMeta: metav1.ObjectMeta{Name: "validation-" + string(rune('a'+i))},
				Spec:       tt.spec,
			}
			err := env.Client.Create(ctx, sm)
			if tt.wantError == "" {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
				return
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.wantError) {
				t.Fatalf("want Invalid mentioning %q, got %v", tt.wantError, err)
			}
		})
	}
}

func TestDefaultsAndImmutableResource(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "immutable"},
		Spec:       spec("stable.example.com", "crontabs"),
	}
	if err := env.Client.Create(ctx, sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	if sm.Spec.PruneStoredVersions == nil || !*sm.Spec.PruneStoredVersions {
		t.Errorf("pruneStoredVersions defaulted to %v, want true", sm.Spec.PruneStoredVersions)
	}
	if sm.Spec.RewriteViaStatus == nil || *sm.Spec.RewriteViaStatus {
		t.Errorf("rewriteViaStatus defaulted to %v, want false", sm.Spec.RewriteViaStatus)
	}

	sm.Spec.Concurrency = ptr.To[int32](8)
	if err := env.Client.Update(ctx, sm); err != nil {
		t.Fatalf("changing a knob: %v", err)
	}
	sm.Spec.Resource.Resource = "cronjobs"
	err := env.Client.Update(ctx, sm)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.resource is immutable") {
		t.Fatalf("changing spec.resource: want Invalid, got %v", err)
	}
}

func spec(group, resource string) migrationv1alpha1.StorageMigrationSpec {
	return migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: group, Resource: resource}}
}

func withConcurrency(s migrationv1alpha1.StorageMigrationSpec, n int32) migrationv1alpha1.StorageMigrationSpec {
	s.Concurrency = &n
	return s
}

func withPageSize(s migrationv1alpha1.StorageMigrationSpec, n int32) migrationv1alpha1.StorageMigrationSpec {
	s.PageSize = &n
	return s
}
