package config_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// prepareJobDir holds the prepare Job of docs/gitops.md, with its overlays
// for Argo CD and Flux.
const prepareJobDir = "samples/prepare-job"

// TestPrepareJobSamples renders the Argo CD and Flux overlays of
// config/samples/prepare-job with the kustomize Go API, as Argo CD and
// Flux do, and checks what each tool needs: for Argo CD every object a
// PreSync hook deleted before it is created again and once it succeeded,
// the ServiceAccount and RBAC in an earlier wave than the Job; for Flux the
// Job replaced when it changes. It then applies the Flux overlay's objects
// to the test control plane (the API server validates them), and runs the
// Job's command as its service account, as the Job's Pod would, against a
// CronTab CRD whose next release drops v1beta1: with restow's operator
// running, it exits 0, and etcd holds every object at v1.
func TestPrepareJobSamples(t *testing.T) {
	ctx := t.Context()
	argo := render(t, prepareJobDir+"/argocd")
	wave := map[string]int{}
	for _, o := range argo {
		a := o.GetAnnotations()
		if a["argocd.argoproj.io/hook"] != "PreSync" || a["argocd.argoproj.io/hook-delete-policy"] != "BeforeHookCreation,HookSucceeded" {
			t.Errorf("Argo CD: %s %s has annotations %v, want a PreSync hook deleted before creation and on success", o.GetKind(), o.GetName(), a)
		}
		w, err := strconv.Atoi(a["argocd.argoproj.io/sync-wave"])
		if err != nil {
			t.Errorf("Argo CD: %s %s has no sync wave: %v", o.GetKind(), o.GetName(), err)
		}
		wave[o.GetKind()+"/"+o.GetNamespace()] = w
	}
	for k, w := range wave {
		if !strings.HasPrefix(k, "Job/") && w >= wave["Job/restow-prepare"] {
			t.Errorf("Argo CD: %s is in wave %d, want one before the Job's (%d)", k, w, wave["Job/restow-prepare"])
		}
	}
	for k, w := range wave {
		if strings.HasPrefix(k, "ValidatingAdmissionPolicy") && w >= wave["ClusterRoleBinding/"] {
			t.Errorf("Argo CD: %s is in wave %d, want one before the RBAC's (%d): the policy holds what the role allows", k, w, wave["ClusterRoleBinding/"])
		}
	}
	if len(argo) != 10 {
		t.Errorf("Argo CD: %d objects rendered, want 10 (admission policy and binding, ServiceAccount, ClusterRole and binding, two Roles and bindings, Job)", len(argo))
	}

	flux := render(t, prepareJobDir+"/flux")
	job := find(t, flux, "Job")
	if job.GetAnnotations()["kustomize.toolkit.fluxcd.io/force"] != "enabled" {
		t.Errorf("Flux: the Job has annotations %v, want kustomize.toolkit.fluxcd.io/force: enabled", job.GetAnnotations())
	}

	// The CRD the Job's --keep names, with objects stored at v1beta1 and a
	// storage switched to v1: the next release keeps v1 alone.
	fx := testenv.Fixture{Env: env, Group: "stable.example.com", Kind: "CronTab", Plural: "crontabs", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	const n = 300
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"cronSpec": "* * * * */5", "replicas": int64(i)} }, "prepare-job-a")
	fx.SwitchStorage(t, "v1")
	// restow's operator as users run it: the manager binary at its
	// defaults, which migrates by itself.
	ensureRestowCRD(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteMigration(t, fx.CRDName()) })
	operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig})

	if err := env.EnsureNamespaces(ctx, "restow-prepare"); err != nil {
		t.Fatal(err)
	}
	for _, o := range flux {
		obj := o.DeepCopy()
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := env.Client.Delete(ctx, obj, client.PropagationPolicy("Background")); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		})
	}
	live := &batchv1.Job{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "restow-prepare", Name: "restow-prepare"}, live); err != nil {
		t.Fatal(err)
	}
	// As shipped: the operator's settle window outlasts the Job's start,
	// so prepare hands the migration to it, or follows the one it began.
	run := runJob(ctx, t, live, nil)
	if run.code != 0 || !strings.Contains(run.out, fx.CRDName()+": the restow operator migrates it") ||
		!strings.Contains(run.out, fx.CRDName()+": prepared: status.storedVersions lists v1 alone") {
		t.Errorf("the prepare Job exited %d, want 0, the migration handed to the operator, and prepared", run.code)
	}
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
}
