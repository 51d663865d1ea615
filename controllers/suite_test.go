package controllers_test

import (
	"context"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{CRDDirectoryPaths: []string{"../config/crd/bases"}, StorageVersionMigrations: true}, &env)
}

// startManager runs restow's controllers, without the automatic trigger, in
// a manager of their own with short intervals, until the test ends or stop is
// called.
func startManager(t *testing.T, cfg *rest.Config) (stop func()) {
	t.Helper()
	return startManagerWith(t, cfg, controllers.Options{})
}

// startManagerWith is startManager with options.
func startManagerWith(t *testing.T, cfg *rest.Config, opts controllers.Options) (stop func()) {
	t.Helper()
	if cfg == nil {
		cfg = env.Config
	}
	return operator.Start(t, cfg, env.Scheme, opts)
}

// fixture is a test CRD whose storage version the test switches.
type fixture struct {
	group, kind, plural string
	namespaced          bool
	// conversion, when set, is the CRD's spec.conversion.
	conversion *apiextensionsv1.CustomResourceConversion
	// labels and annotations go on the CRD.
	labels, annotations map[string]string
	// mutate, when set, changes the CRD before it is installed.
	mutate func(*apiextensionsv1.CustomResourceDefinition)
}

func (f fixture) crdName() string { return f.fx().CRDName() }

// fx is the shared test fixture (internal/testenv) this one delegates to.
func (f fixture) fx() testenv.Fixture {
	return testenv.Fixture{
		Env: env, Group: f.group, Kind: f.kind, Plural: f.plural, Namespaced: f.namespaced,
		Conversion: f.conversion, Labels: f.labels, Annotations: f.annotations, Mutate: f.mutate,
	}
}

// install creates the CRD with the given versions, the first one storage.
func (f fixture) install(t *testing.T, versions ...string) {
	t.Helper()
	f.fx().Install(t, versions...)
}

// switchStorage makes version the CRD's storage version and waits until the
// API server stores new writes at it.
func (f fixture) switchStorage(t *testing.T, version string) {
	t.Helper()
	f.fx().SwitchStorage(t, version)
}

func (f fixture) object(version, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	return f.fx().Object(version, namespace, name, spec)
}

// createObjects creates n objects at v1beta1, the fixtures' first storage
// version, spread over namespaces (ignored for a cluster-scoped fixture), and
// returns their keys.
func (f fixture) createObjects(t *testing.T, n int, namespaces ...string) []client.ObjectKey {
	t.Helper()
	return f.fx().CreateObjects(t, "v1beta1", n, func(int) map[string]any { return map[string]any{"size": int64(1)} }, namespaces...)
}

func ensureNamespaces(t *testing.T, namespaces ...string) {
	t.Helper()
	if err := env.EnsureNamespaces(t.Context(), namespaces...); err != nil {
		t.Fatal(err)
	}
}

// assertStored checks in etcd that every object of the fixture is stored at
// version, and that there are want of them.
func (f fixture) assertStored(t *testing.T, version string, want int) {
	t.Helper()
	f.fx().AssertAllStoredAt(t, version, want)
}

func (f fixture) storedVersions(t *testing.T) []string { t.Helper(); return f.fx().StoredVersions(t) }

func (f fixture) assertStoredVersions(t *testing.T, want ...string) {
	t.Helper()
	f.fx().AssertStoredVersions(t, want...)
}

func (f fixture) crd(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	return f.fx().CRD(t)
}

// createMigration creates the StorageMigration for the fixture's resource.
func (f fixture) createMigration(t *testing.T, mutate func(*migrationv1alpha1.StorageMigration)) *migrationv1alpha1.StorageMigration {
	t.Helper()
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: f.crdName()},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: f.group, Resource: f.plural}},
	}
	if mutate != nil {
		mutate(sm)
	}
	if err := env.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	return sm
}

// slowPassUnderWay creates the fixture's StorageMigration with one worker
// and pages of 50 (mutate may change more) and waits until its pass has
// rewritten 100 objects, so a test can change something mid-pass.
func (f fixture) slowPassUnderWay(t *testing.T, mutate func(*migrationv1alpha1.StorageMigration)) *migrationv1alpha1.StorageMigration {
	t.Helper()
	sm := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) {
		sm.Spec.Concurrency = ptr.To[int32](1)
		sm.Spec.PageSize = ptr.To[int32](50)
		if mutate != nil {
			mutate(sm)
		}
	})
	return waitFor(t, sm.Name, time.Minute, "part-way", func(sm *migrationv1alpha1.StorageMigration) bool {
		return sm.Status.Progress != nil && sm.Status.Progress.Migrated >= 100
	})
}

// waitFor polls the StorageMigration until it exists and done says so, and
// returns it. It fails once the StorageMigration's status has shown no
// progress for stall (testenv.Env.WaitForMigration): a slow machine is waited
// for as long as the work moves. more, if given, are further signs of progress.
func waitFor(t *testing.T, name string, stall time.Duration, what string, done func(*migrationv1alpha1.StorageMigration) bool, more ...func() string) *migrationv1alpha1.StorageMigration {
	t.Helper()
	return env.WaitForMigration(t, name, stall, what, done, more...)
}

// The StorageMigration's states that tests wait for.
var (
	readyAt      = testenv.ReadyAt
	hasCondition = testenv.HasCondition
)

// metricValue reads a counter or gauge, or a histogram's sample count, from
// the registry the manager serves on its metrics endpoint, summed over the
// samples whose labels include labels.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	v, err := gatherMetric(name, labels)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func gatherMetric(name string, labels map[string]string) (float64, error) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	for _, family := range families {
		if family.GetName() == name {
			return operator.SumSamples(family, labels), nil
		}
	}
	return 0, nil
}

// watchPace samples the restow_pass_concurrency gauge of resource every few
// milliseconds until the function it returns is called, which returns the
// highest value seen.
func watchPace(t *testing.T, resource string) func() float64 {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan float64, 1)
	go func() {
		highest := 0.0
		_ = wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
			v, err := gatherMetric("restow_pass_concurrency", map[string]string{"resource": resource})
			highest = max(highest, v)
			return false, err
		})
		done <- highest
	}()
	return func() float64 {
		cancel()
		return <-done
	}
}
