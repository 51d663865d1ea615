// Package config_test renders the kustomize configuration the way users
// install it and applies it to the source-built control plane, so a broken
// manifest fails the tests rather than a user's install.
package config_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env)
}

// render builds a kustomization directory with the kustomize Go API, as
// `kubectl apply -k` does.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out := make([]*unstructured.Unstructured, 0, len(resources.Resources()))
	for _, r := range resources.Resources() {
		raw, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

// find returns the one rendered object of a kind, or of a kind and name.
func find(t *testing.T, objs []*unstructured.Unstructured, kind string, name ...string) *unstructured.Unstructured {
	t.Helper()
	var found *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() != kind || (len(name) > 0 && o.GetName() != name[0]) {
			continue
		}
		if found != nil {
			t.Fatalf("more than one %s rendered: %s and %s", kind, found.GetName(), o.GetName())
		}
		found = o
	}
	if found == nil {
		t.Fatalf("no %s %v rendered", kind, name)
	}
	return found
}

// into converts a rendered object to a typed one.
func into(t *testing.T, u *unstructured.Unstructured, obj any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// apply applies rendered objects server-side, for real, namespaces first.
func apply(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	// Not t.Context(): apply also runs from cleanups, after it ends.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, pass := range []func(*unstructured.Unstructured) bool{
		func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" },
		func(o *unstructured.Unstructured) bool { return o.GetKind() != "Namespace" },
	} {
		for _, o := range objs {
			if !pass(o) {
				continue
			}
			if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner("restow-config-test"), client.ForceOwnership); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// TestDefaultInstall renders config/default and every optional piece, has
// the API server validate each object by a server-side dry-run apply, and
// checks the Deployment is what docs/operations.md promises: two replicas
// with leader election, probes, resources, and a locked-down container.
func TestDefaultInstall(t *testing.T) {
	ctx := t.Context()
	objs := render(t, "default")
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for _, kind := range []string{"CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"Deployment", "Service", "PodDisruptionBudget", "FlowSchema", "PriorityLevelConfiguration"} {
		if kinds[kind] == 0 {
			t.Errorf("config/default renders no %s", kind)
		}
	}
	// The namespace must exist for a dry run of what goes in it.
	apply(t, []*unstructured.Unstructured{find(t, objs, "Namespace")})
	for _, o := range objs {
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner("restow-config-test"), client.ForceOwnership, client.DryRunAll); err != nil {
			t.Errorf("server-side dry run of %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	// The sample is valid against the installed CRD. The ServiceMonitor
	// needs the Prometheus Operator's CRD, so it is only rendered.
	crd := find(t, objs, "CustomResourceDefinition")
	apply(t, []*unstructured.Unstructured{crd})
	if err := env.WaitForCRD(ctx, crd.GetName()); err != nil {
		t.Fatal(err)
	}
	for _, o := range render(t, "samples") {
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("restow-config-test"), client.DryRunAll); err != nil {
			t.Errorf("server-side dry run of the sample %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	find(t, render(t, "testdata/monitoring"), "ServiceMonitor")

	var deploy appsv1.Deployment
	into(t, find(t, objs, "Deployment"), &deploy)
	spec := deploy.Spec.Template.Spec
	if deploy.Spec.Replicas == nil || *deploy.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", deploy.Spec.Replicas)
	}
	c := spec.Containers[0]
	if !slices.Contains(c.Args, "--leader-elect") {
		t.Errorf("args %v lack --leader-elect", c.Args)
	}
	if c.LivenessProbe == nil || c.ReadinessProbe == nil {
		t.Error("liveness or readiness probe missing")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil, sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot, sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem,
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation, sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Errorf("container security context %+v: want non-root, read-only root filesystem, no privilege escalation, all capabilities dropped", sc)
	}
	if psc := spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want seccomp RuntimeDefault", psc)
	}
	var pdb policyv1.PodDisruptionBudget
	into(t, find(t, objs, "PodDisruptionBudget"), &pdb)
	if selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !selector.Matches(labels.Set(deploy.Spec.Template.Labels)) {
		t.Errorf("the PodDisruptionBudget's selector %v does not select the manager's pods %v", pdb.Spec.Selector, deploy.Spec.Template.Labels)
	}
}

// TestFlowControlClassifiesTheManagersBulkRequests renders config/default,
// checks that kustomize carried its name prefix and namespace into the
// FlowSchemas' references, applies it, and shows through the API server's
// own response headers that the manager's service account's lists, patches
// and updates run in restow's priority level, while its lease reads and
// renewals (updates too) are taken by the leader-election schema first.
func TestFlowControlClassifiesTheManagersBulkRequests(t *testing.T) {
	ctx := t.Context()
	objs := render(t, "default")
	var schema, leases flowcontrolv1.FlowSchema
	var level flowcontrolv1.PriorityLevelConfiguration
	var sa corev1.ServiceAccount
	into(t, find(t, objs, "FlowSchema", "restow-migrations"), &schema)
	into(t, find(t, objs, "FlowSchema", "restow-leader-election"), &leases)
	into(t, find(t, objs, "PriorityLevelConfiguration"), &level)
	into(t, find(t, objs, "ServiceAccount"), &sa)
	if schema.Spec.PriorityLevelConfiguration.Name != level.Name {
		t.Errorf("FlowSchema %s refers to priority level %q, but the rendered one is %q", schema.Name, schema.Spec.PriorityLevelConfiguration.Name, level.Name)
	}
	for _, fs := range []flowcontrolv1.FlowSchema{schema, leases} {
		subject := fs.Spec.Rules[0].Subjects[0].ServiceAccount
		if subject == nil || subject.Name != sa.Name || subject.Namespace != sa.Namespace {
			t.Errorf("FlowSchema %s's subject is %+v, want the manager's service account %s/%s", fs.Name, subject, sa.Namespace, sa.Name)
		}
	}
	apply(t, objs)

	uids := map[types.UID]string{}
	for _, name := range []string{schema.Name, leases.Name} {
		live := &flowcontrolv1.FlowSchema{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, live); err != nil {
			t.Fatal(err)
		}
		uids[live.UID] = name
	}
	// Requests as the manager's service account, recording the flow schema
	// the API server classified each into.
	var classifiedBy string
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: serviceaccount.MakeUsername(sa.Namespace, sa.Name)}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil {
				classifiedBy = resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID)
			}
			return resp, err
		})
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flowcontrol-probe", Namespace: "default"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "flowcontrol-probe", Namespace: sa.Namespace}}
	if err := env.Client.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	for _, request := range []struct {
		what string
		do   func(context.Context) error
		// by is the schema that must classify the request.
		by string
	}{
		{"list configmaps", func(ctx context.Context) error {
			_, err := clientset.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{Limit: 1})
			return err
		}, schema.Name},
		{"patch a configmap", func(ctx context.Context) error {
			_, err := clientset.CoreV1().ConfigMaps("default").Patch(ctx, cm.Name, types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
			return err
		}, schema.Name},
		{"update a configmap as read", func(ctx context.Context) error {
			current, err := clientset.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + cm.Name})
			switch {
			case err != nil:
				return err
			case len(current.Items) != 1:
				return fmt.Errorf("listing it back found %d", len(current.Items))
			}
			_, err = clientset.CoreV1().ConfigMaps("default").Update(ctx, &current.Items[0], metav1.UpdateOptions{})
			return err
		}, schema.Name},
		{"get a lease", func(ctx context.Context) error {
			_, err := clientset.CoordinationV1().Leases(sa.Namespace).Get(ctx, lease.Name, metav1.GetOptions{})
			return err
		}, leases.Name},
		{"renew a lease", func(ctx context.Context) error {
			current, err := clientset.CoordinationV1().Leases(sa.Namespace).Get(ctx, lease.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			current.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, err = clientset.CoordinationV1().Leases(sa.Namespace).Update(ctx, current, metav1.UpdateOptions{})
			return err
		}, leases.Name},
	} {
		classifiedBy = ""
		if err := request.do(ctx); err != nil {
			t.Fatalf("%s as %s: %v", request.what, cfg.Impersonate.UserName, err)
		}
		if got := uids[types.UID(classifiedBy)]; got != request.by {
			t.Errorf("%s: classified by flow schema UID %q (%q), want %s", request.what, classifiedBy, got, request.by)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
