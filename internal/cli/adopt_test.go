package cli_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/cli"
)

// TestMigrateAdoptsOneCreatedMeanwhile: the operator creates the
// StorageMigration of a CRD whose storage version switched, named after the
// CRD, between migrate's list and its create (prepare hands its migrations
// to the operator through migrate's request, so it meets the same race when
// the switching release and the dropping one are applied back to back).
// migrate asks that StorageMigration for a pass, as if it had listed it,
// rather than failing on AlreadyExists.
func TestMigrateAdoptsOneCreatedMeanwhile(t *testing.T) {
	w := installSwitched(t, "adopt.cli.restow.dev", 10)
	w.deleteMigrationsAtEnd(t)
	var once sync.Once
	var created error
	restore := cli.SetWrapTransport(func(rt http.RoundTripper) http.RoundTripper {
		return roundTrip(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/storagemigrations") {
				once.Do(func() {
					created = env.Client.Create(req.Context(), &migrationv1alpha1.StorageMigration{
						ObjectMeta: metav1.ObjectMeta{Name: w.crdName()},
						Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: w.group, Resource: "widgets"}},
					})
				})
			}
			return rt.RoundTrip(req)
		})
	})
	out, errOut, code := restow(t, "migrate", w.crdName())
	restore()
	if created != nil {
		t.Fatalf("creating the operator's StorageMigration meanwhile: %v", created)
	}
	if code != 0 || !strings.Contains(out, "Requested a new pass of StorageMigration "+w.crdName()) {
		t.Fatalf("migrate exited %d, want 0 and a pass of the StorageMigration created meanwhile:\n%s%s", code, out, errOut)
	}
	sm := &migrationv1alpha1.StorageMigration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: w.crdName()}, sm); err != nil {
		t.Fatal(err)
	}
	if sm.Annotations[migrationv1alpha1.ReRunAnnotation] == "" {
		t.Errorf("StorageMigration %s has no %s annotation: no pass was asked of it", sm.Name, migrationv1alpha1.ReRunAnnotation)
	}
}
