package config_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
)

// crdAuthorDir holds the Helm hook of docs/crd-authors.md: a Job that runs
// `kubectl restow run` from restow's image, and its ServiceAccount and RBAC.
const crdAuthorDir = "samples/crd-author"

// crdTemplate is the template of a CRD author's chart that applies the CRD
// kept in files/, as docs/crd-authors.md shows it.
const crdTemplate = `{{ .Files.Get "files/crontabs.yaml" }}
`

// crdAuthorsDoc is the guide that shows the files of crdAuthorDir.
const crdAuthorsDoc = "../docs/crd-authors.md"

// TestCRDAuthorHook ships the files of config/samples/crd-author, unchanged,
// as the templates of a CRD author's chart beside the sample CronTab CRD
// (config/samples/crontabs), and installs and upgrades that chart for real
// with Helm's Go API, as `helm install` and `helm upgrade` do. The test
// control plane runs no Job controller and no kubelet, so the test stands in
// for both: when Helm creates the hook Job, the test runs the Job's command
// in-process (cli.Execute, the plugin the image ships at /kubectl-restow),
// authenticated as the Job's service account with nothing but the hook's
// RBAC, and writes the exit code into the Job's status, which Helm waits for.
//
//   - The install (storage v1beta1, no objects yet) runs the hook: exit 0.
//   - An upgrade that switches the storage to v1 while an admission policy
//     refuses one object: the hook exits 2, the upgrade fails, nothing is
//     pruned, and the failed Job stays for its log.
//   - The same upgrade once the policy is gone: the hook exits 0, etcd holds
//     every object at v1, status.storedVersions is [v1], and Helm deletes
//     the Job, the ServiceAccount and the roles. Before that run the service
//     account is checked to be able to do what the guide lists and nothing
//     else (SubjectAccessReviews, and direct calls that must be Forbidden).
func TestCRDAuthorHook(t *testing.T) {
	ctx := t.Context()
	const name, namespace = "crontab-operator", "crontab-operator"
	before := readChartFile(t, "samples/crontabs/crd-storage-v1beta1.yaml")
	switched := readChartFile(t, "samples/crontabs/crd-storage-v1.yaml")
	first := authorChart(t, "1.0.0", before, true)
	second := authorChart(t, "2.0.0", switched, true)

	crdName := "crontabs.stable.example.com"
	fx := testenv.Fixture{Env: env, Group: "stable.example.com", Kind: "CronTab", Plural: "crontabs", Namespaced: true}
	if fx.CRDName() != crdName {
		t.Fatalf("the fixture names %s, want %s", fx.CRDName(), crdName)
	}
	// Another CRD, which the hook's service account must not touch.
	other := testenv.Fixture{Env: env, Group: "crd-author.config.restow.dev", Kind: "Gadget", Plural: "gadgets"}
	other.Install(t, "v1beta1", "v1")

	jobKey := client.ObjectKey{Namespace: namespace, Name: name + "-restow-run"}
	prepareKey := client.ObjectKey{Namespace: namespace, Name: name + "-restow-prepare"}
	cfg := authorRelease(t, name, crdName)

	// helm install: the hook runs at once; nothing is stored at an old version.
	runs, err := installAuthor(t, cfg, name, first)
	if run := runs[jobKey.Name]; err != nil || run.code != 0 || len(runs) != 1 {
		t.Fatalf("helm install: %v; the hooks ran %+v, want the run hook alone, exit 0", err, runs)
	}
	assertGone(t, hookObjects(name, namespace)...)

	// The users' objects, written at v1beta1: the sample's three and 300 more.
	samples := decodeObjects(t, "crontabs.yaml")
	for _, o := range samples {
		if err := env.Client.Create(ctx, o.DeepCopy(), client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Fatalf("creating the sample %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	keys := fx.CreateObjects(t, "v1beta1", 300, func(i int) map[string]any {
		return map[string]any{"cronSpec": "*/5 * * * *", "image": "registry.example.com/job:1", "replicas": int64(i % 3)}
	}, "crd-author-a", "crd-author-b")
	total := len(samples) + len(keys)
	fx.AssertAllStoredAt(t, "v1beta1", total)
	fx.AssertStoredVersions(t, "v1beta1")

	upgrade := func() error {
		up := action.NewUpgrade(helmConfig(t, namespace))
		up.Namespace, up.WaitStrategy, up.Timeout = namespace, kube.HookOnlyStrategy, 2*time.Minute
		_, err := up.RunWithContext(ctx, name, second, nil)
		return err
	}

	t.Run("an object the pass cannot rewrite fails the upgrade, prunes nothing", func(t *testing.T) {
		frozen := fx.Object("v1beta1", keys[7].Namespace, keys[7].Name, nil)
		remove, err := env.DenyUpdates(ctx, frozen, fx.Plural)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := remove(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		runs, err := withJobStandIn(t, namespace, nil, upgrade)
		if prep := runs[prepareKey.Name]; prep.code != 0 || !strings.Contains(prep.out, crdName+": ok, nothing to prepare") {
			t.Errorf("the pre-upgrade prepare hook exited %d, want 0 and nothing to prepare: the release keeps v1beta1", prep.code)
		}
		run := runs[jobKey.Name]
		if err == nil || run.code != cli.ExitPending {
			t.Fatalf("helm upgrade with a frozen object: %v; the hook exited %d, want a failed upgrade and exit %d", err, run.code, cli.ExitPending)
		}
		t.Logf("helm upgrade: %v", err)
		for _, want := range []string{"1 objects of crontabs.stable.example.com could not be rewritten to v1", "nothing was pruned", testenv.FrozenMessage} {
			if !strings.Contains(run.out, want) {
				t.Errorf("the hook's output does not say %q", want)
			}
		}
		fx.AssertStoredVersions(t, "v1beta1", "v1")
		fx.AssertStored(t, map[string]int{"v1": total - 1, "v1beta1": 1})
		// The failed Job stays for its log; the next upgrade replaces it.
		// Helm deletes the hooks that succeeded before it, as after a
		// success: the ServiceAccount and the roles.
		var job batchv1.Job
		if err := env.Client.Get(ctx, jobKey, &job); err != nil {
			t.Fatalf("the failed hook Job is gone: %v", err)
		}
		if !jobHas(&job, batchv1.JobFailed) {
			t.Errorf("the hook Job's conditions are %+v, want Failed", job.Status.Conditions)
		}
		assertGone(t, hookObjects(name, namespace)[1:]...)
	})

	t.Run("the upgrade again: every object at v1, v1beta1 pruned, hooks deleted", func(t *testing.T) {
		checked := false
		runs, err := withJobStandIn(t, namespace, func(job *batchv1.Job) {
			if job.Name == jobKey.Name {
				assertHookRBACIsTight(t, job, crdName, other.CRDName())
				checked = true
			}
		}, upgrade)
		run := runs[jobKey.Name]
		if err != nil || run.code != 0 || runs[prepareKey.Name].code != 0 {
			t.Fatalf("helm upgrade: %v; the hook exited %d", err, run.code)
		}
		if !checked {
			t.Error("the hook's RBAC was not checked")
		}
		fx.AssertAllStoredAt(t, "v1", total)
		fx.AssertStoredVersions(t, "v1")
		if want := "Removed [v1beta1] from status.storedVersions of CRD crontabs.stable.example.com."; !strings.Contains(run.out, want) {
			t.Errorf("the hook's output does not say %q", want)
		}
		// With the Role in kube-system it counts one API server and waits
		// for no lag bound; with list on StorageVersionMigrations it reads
		// them (none) without a warning.
		for _, unwanted := range []string{"before the first pass", "Warning:", "forbidden"} {
			if strings.Contains(run.out, unwanted) {
				t.Errorf("the hook's output says %q", unwanted)
			}
		}
		assertGone(t, hookObjects(name, namespace)...)
	})
}

// withoutVersion is a CRD manifest without one of its versions.
func withoutVersion(t *testing.T, raw []byte, version string) []byte {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(raw, crd); err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions = slices.DeleteFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == version })
	crd.APIVersion, crd.Kind = apiextensionsv1.SchemeGroupVersion.String(), "CustomResourceDefinition"
	out, err := yaml.Marshal(crd)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// assertSpecs lists fx's objects at version and checks each one's spec.
func assertSpecs(t *testing.T, fx testenv.Fixture, version string, keys []client.ObjectKey, spec func(int) map[string]any) {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(fx.GVK(version))
	if err := env.Client.List(t.Context(), list); err != nil {
		t.Fatal(err)
	}
	got := map[client.ObjectKey]any{}
	for _, o := range list.Items {
		got[client.ObjectKeyFromObject(&o)] = o.Object["spec"]
	}
	for i, k := range keys {
		if !reflect.DeepEqual(got[k], spec(i)) {
			t.Fatalf("%s at %s has spec %v, want %v (%d objects listed)", k, version, got[k], spec(i), len(got))
		}
	}
}

// ensureRestowCRD installs restow's StorageMigration CRD unless the
// chart's tests left it (its resource-policy is keep), and deletes it at
// the end if it installed it.
func ensureRestowCRD(t *testing.T) {
	t.Helper()
	const restowCRD = "storagemigrations.migration.restow.dev"
	err := env.Client.Get(t.Context(), client.ObjectKey{Name: restowCRD}, &apiextensionsv1.CustomResourceDefinition{})
	if !apierrors.IsNotFound(err) {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(readChartFile(t, "crd/bases/migration.restow.dev_storagemigrations.yaml"), crd); err != nil {
		t.Fatal(err)
	}
	env.InstallCRDForTest(t, crd)
}

// authorRelease is the Helm configuration of a release of the CRD author's
// chart named name, in a namespace of the same name; when the test ends it
// is uninstalled and its CRD, a template, deleted with its objects.
func authorRelease(t *testing.T, name, crdName string) *action.Configuration {
	t.Helper()
	cfg := helmConfig(t, name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := cfg.Releases.Last(name); err == nil {
			uninstallChart(t, cfg, name)
		}
		if err := env.DeleteCRD(ctx, crdName); err != nil {
			t.Error(err)
		}
	})
	return cfg
}

// installAuthor installs ch as release name, as `helm install
// --create-namespace --wait=hookOnly` does, standing in for its hook Jobs.
func installAuthor(t *testing.T, cfg *action.Configuration, name string, ch *chart.Chart) (map[string]hookRun, error) {
	t.Helper()
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = name, name, true
	install.WaitStrategy, install.Timeout = kube.HookOnlyStrategy, 2*time.Minute
	return withJobStandIn(t, name, nil, func() error {
		_, err := install.RunWithContext(t.Context(), ch, nil)
		return err
	})
}

// cronTabSpec is the spec of the i-th CronTab the hook tests write.
func cronTabSpec(i int) map[string]any {
	return map[string]any{"cronSpec": fmt.Sprintf("*/%d * * * *", i%59+1), "image": fmt.Sprintf("registry.example.com/job:%d", i), "replicas": int64(i % 5)}
}

// hookRun is one run of the hook Job's command.
type hookRun struct {
	code int
	out  string
}

// withJobStandIn runs a Helm action while standing in for the Job
// controller and the kubelet of every hook Job Helm creates in namespace
// meanwhile (actAsJobController), and returns each Job's run by name and
// the action's error.
func withJobStandIn(t *testing.T, namespace string, check func(*batchv1.Job), action func() error) (map[string]hookRun, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan map[string]hookRun, 1)
	// A short settle window: no write is held on the old storage here.
	go func() { ran <- actAsJobController(ctx, t, namespace, check, "--settle-window=2s") }()
	err := action()
	cancel()
	return <-ran, err
}

// withHooksAsShipped runs action while standing in for the Job controller,
// running each hook Job's command with nothing added: the settings as
// shipped.
func withHooksAsShipped(t *testing.T, namespace string, action func() error) (map[string]hookRun, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan map[string]hookRun, 1)
	go func() { ran <- actAsJobController(ctx, t, namespace, nil) }()
	err := action()
	cancel()
	return <-ran, err
}

// actAsJobController, until ctx ends, waits for Helm to create a hook Job
// in namespace (one that has not finished: not the one a failed run left),
// runs check on it, runs its container's command in-process as the Job's
// service account with extra arguments, and writes the outcome into the
// Job's status as the Job controller does with backoffLimit 0: Complete
// after exit 0, Failed after any other. It returns each Job's run by name.
func actAsJobController(ctx context.Context, t *testing.T, namespace string, check func(*batchv1.Job), extra ...string) map[string]hookRun {
	runs := map[string]hookRun{}
	done := map[types.UID]bool{}
	for {
		job := &batchv1.Job{}
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			var jobs batchv1.JobList
			if err := env.Client.List(ctx, &jobs, client.InNamespace(namespace)); err != nil {
				return false, err
			}
			for i := range jobs.Items {
				j := &jobs.Items[i]
				if !done[j.UID] && !jobHas(j, batchv1.JobComplete) && !jobHas(j, batchv1.JobFailed) {
					*job = *j
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return runs
		}
		done[job.UID] = true
		runs[job.Name] = runJob(ctx, t, job, check, extra...)
	}
}

// runJob runs job's command as the Job controller and the kubelet would.
func runJob(ctx context.Context, t *testing.T, job *batchv1.Job, check func(*batchv1.Job), extra ...string) hookRun {
	spec := job.Spec.Template.Spec
	if len(spec.Containers) != 1 || !slices.Equal(spec.Containers[0].Command, []string{"/kubectl-restow"}) {
		t.Errorf("the hook Job runs %+v, want one container running the image's /kubectl-restow", spec.Containers)
		return hookRun{code: -1}
	}
	if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 0 || spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("the hook Job has backoffLimit %v and restartPolicy %s, want 0 and Never", job.Spec.BackoffLimit, spec.RestartPolicy)
	}
	// Helm created the hook's ServiceAccount before the Job (weight -1).
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: spec.ServiceAccountName}, &corev1.ServiceAccount{}); err != nil {
		t.Errorf("the hook Job's service account: %v", err)
	}
	if check != nil {
		check(job)
	}

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfigAs(kubeconfig, serviceaccount.MakeUsername(job.Namespace, spec.ServiceAccountName), serviceaccount.MakeGroupNames(job.Namespace)...); err != nil {
		t.Error(err)
		return hookRun{code: -1}
	}
	args, err := mountConfigMaps(ctx, t, job)
	if err != nil {
		t.Error(err)
		return hookRun{code: -1}
	}
	args = append(args, "--kubeconfig="+kubeconfig, "--cache-dir="+filepath.Join(dir, "cache"))
	args = append(args, extra...)
	var out bytes.Buffer
	started := metav1.Now()
	code := cli.Execute(ctx, args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	t.Logf("/kubectl-restow %s: exit %d\n%s", strings.Join(args, " "), code, out.String())

	// As the Job controller writes a finished Job's status.
	ended := metav1.Now()
	job.Status.StartTime = &started
	if code == 0 {
		job.Status.Succeeded = 1
		job.Status.CompletionTime = &ended
		job.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: ended, LastTransitionTime: ended},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonCompletionsReached, LastProbeTime: ended, LastTransitionTime: ended},
		}
	} else {
		job.Status.Failed = 1
		job.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded, LastProbeTime: ended, LastTransitionTime: ended},
			{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded, Message: "Job has reached the specified backoff limit", LastProbeTime: ended, LastTransitionTime: ended},
		}
	}
	if err := env.Client.Status().Update(ctx, job); err != nil {
		t.Errorf("writing the hook Job's status: %v", err)
	}
	return hookRun{code: code, out: out.String()}
}

// mountConfigMaps does what the kubelet does for the Job's ConfigMap
// volumes: it writes each key of each ConfigMap into a directory of its
// own, and returns the container's arguments with each mount path
// replaced by that directory. A ConfigMap that does not exist fails the
// run, as the kubelet would not start the Pod.
func mountConfigMaps(ctx context.Context, t *testing.T, job *batchv1.Job) ([]string, error) {
	spec := job.Spec.Template.Spec
	args := slices.Clone(spec.Containers[0].Args)
	for _, v := range spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		i := slices.IndexFunc(spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name })
		if i < 0 {
			continue
		}
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: v.ConfigMap.Name}, cm); err != nil {
			return nil, fmt.Errorf("the Job's volume %s: %w", v.Name, err)
		}
		// Not under dir: a test's name may hold a comma, which -f splits on.
		local, err := os.MkdirTemp("", "volume-"+v.Name+"-")
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = os.RemoveAll(local) })
		for key, value := range cm.Data {
			if err := os.WriteFile(filepath.Join(local, key), []byte(value), 0o600); err != nil {
				return nil, err
			}
		}
		mount := strings.TrimSuffix(spec.Containers[0].VolumeMounts[i].MountPath, "/") + "/"
		for j, a := range args {
			if k := strings.Index(a, mount); k >= 0 {
				args[j] = a[:k] + local + "/" + a[k+len(mount):]
			}
		}
	}
	return args, nil
}

// jobHas reports whether a Job's condition of type is true.
func jobHas(job *batchv1.Job, condition batchv1.JobConditionType) bool {
	return slices.ContainsFunc(job.Status.Conditions, func(c batchv1.JobCondition) bool {
		return c.Type == condition && c.Status == corev1.ConditionTrue
	})
}

// assertHookRBACIsTight checks, while the hook runs, that its service
// account may do what docs/crd-authors.md lists for `run` and no more:
// nothing on Secrets, on other CRDs, on the CRD's spec, and no get, create or
// delete of the objects (a pass needs none).
func assertHookRBACIsTight(t *testing.T, job *batchv1.Job, crdName, otherCRD string) {
	t.Helper()
	ctx := t.Context()
	user := serviceaccount.MakeUsername(job.Namespace, job.Spec.Template.Spec.ServiceAccountName)
	groups := serviceaccount.MakeGroupNames(job.Namespace)
	type attrs = authorizationv1.ResourceAttributes
	crontabs := func(verb, ns string) attrs {
		return attrs{Verb: verb, Group: "stable.example.com", Resource: "crontabs", Namespace: ns}
	}
	crd := func(verb, subresource, name string) attrs {
		return attrs{Verb: verb, Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions", Subresource: subresource, Name: name}
	}
	for _, c := range []struct {
		attrs   attrs
		allowed bool
	}{
		{crontabs("list", ""), true},
		{crontabs("update", "crd-author-a"), true},
		{crontabs("patch", "crd-author-b"), true},
		{crd("get", "", crdName), true},
		{crd("watch", "", crdName), true},
		{crd("patch", "status", crdName), true},
		{crd("list", "", ""), true},
		{attrs{Verb: "list", Group: "storagemigration.k8s.io", Resource: "storageversionmigrations"}, true},
		{attrs{Verb: "list", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"}, true},
		{attrs{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: "default"}, true},

		{crontabs("get", "crd-author-a"), false},
		{crontabs("watch", ""), false},
		{crontabs("create", "crd-author-a"), false},
		{crontabs("delete", "crd-author-a"), false},
		{crontabs("deletecollection", "crd-author-a"), false},
		{crd("get", "", otherCRD), false},
		{crd("watch", "", otherCRD), false},
		{crd("patch", "status", otherCRD), false},
		{crd("update", "status", crdName), false},
		{crd("patch", "", crdName), false},
		{crd("update", "", crdName), false},
		{crd("delete", "", crdName), false},
		{crd("watch", "", ""), false},
		{attrs{Verb: "list", Resource: "secrets"}, false},
		{attrs{Verb: "get", Resource: "secrets", Namespace: job.Namespace}, false},
		{attrs{Verb: "list", Resource: "secrets", Namespace: "kube-system"}, false},
		{attrs{Verb: "list", Resource: "configmaps", Namespace: "kube-system"}, false},
		{attrs{Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"}, false},
		{attrs{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"}, false},
		{attrs{Verb: "list", Group: "coordination.k8s.io", Resource: "leases", Namespace: job.Namespace}, false},
		{attrs{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: job.Namespace}, false},
		{attrs{Verb: "get", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: "default"}, false},
		{attrs{Verb: "create", Group: "storagemigration.k8s.io", Resource: "storageversionmigrations"}, false},
		{attrs{Verb: "list", Group: "migration.restow.dev", Resource: "storagemigrations"}, true},
		{attrs{Verb: "create", Group: "migration.restow.dev", Resource: "storagemigrations"}, true},
		{attrs{Verb: "get", Group: "migration.restow.dev", Resource: "storagemigrations", Name: crdName}, true},
		{attrs{Verb: "watch", Group: "migration.restow.dev", Resource: "storagemigrations", Name: crdName}, true},
		{attrs{Verb: "patch", Group: "migration.restow.dev", Resource: "storagemigrations", Name: crdName}, true},
		{attrs{Verb: "get", Group: "migration.restow.dev", Resource: "storagemigrations", Name: otherCRD}, false},
		{attrs{Verb: "patch", Group: "migration.restow.dev", Resource: "storagemigrations", Name: otherCRD}, false},
		{attrs{Verb: "watch", Group: "migration.restow.dev", Resource: "storagemigrations"}, false},
		{attrs{Verb: "delete", Group: "migration.restow.dev", Resource: "storagemigrations"}, false},
		{attrs{Verb: "update", Group: "migration.restow.dev", Resource: "storagemigrations", Subresource: "status"}, false},
		{attrs{Verb: "list", Group: "crd-author.config.restow.dev", Resource: "gadgets"}, false},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups, ResourceAttributes: &c.attrs,
		}}
		if err := env.Client.Create(ctx, review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != c.allowed {
			t.Errorf("%s may %s %s/%s %s in %q: %v, want %v (%s)", user, c.attrs.Verb, c.attrs.Resource, c.attrs.Subresource, c.attrs.Name, c.attrs.Namespace,
				review.Status.Allowed, c.allowed, review.Status.Reason)
		}
	}

	// etcd's size, which a pass reads before it writes (package quota).
	metrics := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups, NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}}
	if err := env.Client.Create(ctx, metrics); err != nil {
		t.Fatal(err)
	}
	if !metrics.Status.Allowed {
		t.Errorf("%s may not get /metrics, where a pass reads etcd's size: %s", user, metrics.Status.Reason)
	}

	// The same refusals from the API server itself, as the Job's Pod would
	// meet them.
	cfg, err := env.ConfigAs(user, groups...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &corev1.SecretList{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets as the hook's service account: %v, want Forbidden", err)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"storedVersions":["v1"]}}`))
	target := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: otherCRD}}
	if err := c.Status().Patch(ctx, target, patch); !apierrors.IsForbidden(err) {
		t.Errorf("pruning another CRD's status.storedVersions as the hook's service account: %v, want Forbidden", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: otherCRD}, &apiextensionsv1.CustomResourceDefinition{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading another CRD as the hook's service account: %v, want Forbidden", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: crdName}, &apiextensionsv1.CustomResourceDefinition{}); err != nil {
		t.Errorf("reading its own CRD as the hook's service account: %v", err)
	}
}

// hookObjects are the hooks of config/samples/crd-author in a release, the
// Job first.
func hookObjects(release, namespace string) []client.Object {
	name := release + "-restow-run"
	return []client.Object{
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name}},
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release + "-restow-prepare"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release + "-restow-prepare"}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: release + "-restow-prepare"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release + "-restow-release-crds"}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: release + "-restow-prepare"}},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: release + "-restow-prepare"}},
	}
}

// assertGone checks that Helm deleted hooks as their hook-delete-policy
// hook-succeeded says.
func assertGone(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, obj := range objs {
		err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), obj)
		if !apierrors.IsNotFound(err) {
			t.Errorf("%T %s: %v, want it deleted", obj, client.ObjectKeyFromObject(obj), err)
		}
	}
}

// readChartFile reads a file of config/.
func readChartFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// authorChart writes the chart a CRD author ships, as a directory, and loads
// it as `helm install ./crontab-operator` does: the CRD in files/, which a
// template includes (Helm never upgrades the CRDs of crds/, and the prepare
// hook's ConfigMap carries it from files/), and, with hooks, the files of
// config/samples/crd-author as they are.
func authorChart(t *testing.T, version string, crd []byte, hooks bool) *chart.Chart {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "crontab-operator")
	files := map[string][]byte{
		"Chart.yaml":              fmt.Appendf(nil, "apiVersion: v2\nname: crontab-operator\nversion: %s\n", version),
		"files/crontabs.yaml":     crd,
		"templates/crontabs.yaml": []byte(crdTemplate),
	}
	entries, err := os.ReadDir(crdAuthorDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if hooks {
			files["templates/"+e.Name()] = readChartFile(t, filepath.Join(crdAuthorDir, e.Name()))
		}
	}
	for path, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, path), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatalf("loading the CRD author's chart: %v", err)
	}
	return ch
}

// docFileBlock is a link to a file of config/samples/crd-author followed by
// the YAML block that shows it.
var docFileBlock = regexp.MustCompile("(?s)\\]\\(\\.\\./config/samples/crd-author/([a-z-]+\\.yaml)\\)[^`]*```yaml\n(.*?)```")

// TestCRDAuthorsDocShowsTheSamples holds docs/crd-authors.md to the files
// of config/samples/crd-author: each is shown once, byte for byte, in the
// YAML block after the link to it, and each file is a Helm template that
// renders to objects the scheme knows.
func TestCRDAuthorsDocShowsTheSamples(t *testing.T) {
	doc, err := os.ReadFile(crdAuthorsDoc)
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]int{}
	for _, m := range docFileBlock.FindAllSubmatch(doc, -1) {
		file := string(m[1])
		shown[file]++
		want, err := os.ReadFile(filepath.Join(crdAuthorDir, file))
		if err != nil {
			t.Errorf("%s shows %s, which does not exist: %v", crdAuthorsDoc, file, err)
			continue
		}
		if got := m[2]; !bytes.Equal(got, want) {
			t.Errorf("%s shows %s other than it is; the file:\n%s\nthe guide:\n%s", crdAuthorsDoc, file, want, got)
		}
	}
	entries, err := os.ReadDir(crdAuthorDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if shown[e.Name()] != 1 {
			t.Errorf("%s shows %s %d times, want once", crdAuthorsDoc, e.Name(), shown[e.Name()])
		}
	}
	if len(shown) != len(entries) {
		t.Errorf("%s shows %d files of %s, which holds %d", crdAuthorsDoc, len(shown), crdAuthorDir, len(entries))
	}

	// Rendered as a chart's templates, every object decodes strictly.
	r, err := templateChart(authorChart(t, "1.0.0", readChartFile(t, "samples/crontabs/crd-storage-v1.yaml"), true), "crontab-operator", "crontab-operator", nil)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	kinds := map[string]int{}
	for _, h := range r.Hooks {
		for _, u := range decodeManifests(t, h.Manifest) {
			kinds[u.GetKind()]++
			raw, err := yaml.Marshal(u.Object)
			if err != nil {
				t.Fatal(err)
			}
			obj, err := env.Scheme.New(u.GroupVersionKind())
			if err != nil {
				t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
			}
			if err := yaml.UnmarshalStrict(raw, obj); err != nil {
				t.Errorf("%s %s does not decode strictly: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
	// The run and prepare Jobs; Roles and RoleBindings in kube-system
	// (Leases) and default (EndpointSlices); the release's CRD for prepare;
	// the admission policies of the run and prepare roles, bound.
	want := map[string]int{"ConfigMap": 1, "Job": 2, "ServiceAccount": 1, "ClusterRole": 2, "ClusterRoleBinding": 2, "Role": 2, "RoleBinding": 2,
		"ValidatingAdmissionPolicy": 2, "ValidatingAdmissionPolicyBinding": 2}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("the hooks rendered %v, want %v", kinds, want)
	}
}
