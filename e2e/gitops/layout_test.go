//go:build e2e && gitops

package gitops

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
)

const (
	samples    = "../../config/samples"
	prepareJob = samples + "/prepare-job"
	crontabs   = "crontabs.stable.example.com"
	// keepLine is the line of the shipped Job that names the versions the
	// release in git keeps; each release below changes it, as gitops.md
	// says to, in the same commit as the CRD.
	keepLine = "--keep=" + crontabs + "=v1"
)

// layoutRelease is one commit of the repository of docs/gitops.md's
// layout: the CRD's manifest and the versions the prepare Job keeps.
type layoutRelease struct {
	name, crd, keep string
}

var layoutReleases = []layoutRelease{
	{"v1beta1 stored", "crontabs/crd-storage-v1beta1.yaml", "v1beta1,v1"},
	{"storage switched to v1", "crontabs/crd-storage-v1.yaml", "v1beta1,v1"},
	{"v1beta1 dropped", "crontabs/crd-v1beta1-removed.yaml", "v1"},
}

// files is the repository at release r: the CRD (and, with restow, its
// StorageMigration) under crds/crontabs, the prepare Job's sample as
// shipped under restow/prepare-job with r's --keep.
func (r layoutRelease) files(t *testing.T, restow bool) map[string][]byte {
	t.Helper()
	read := func(path string) []byte {
		raw, err := os.ReadFile(filepath.Join(samples, path))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	files := map[string][]byte{"crds/crontabs/crd.yaml": read(r.crd)}
	if restow {
		files["crds/crontabs/storagemigration.yaml"] = read("migration_v1alpha1_storagemigration.yaml")
	}
	var names []string
	for _, dir := range []string{"base", "flux"} {
		entries, err := os.ReadDir(filepath.Join(prepareJob, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			names = append(names, dir+"/"+e.Name())
		}
	}
	for _, name := range names {
		raw := read("prepare-job/" + name)
		if name == "base/job.yaml" {
			if !bytes.Contains(raw, []byte(keepLine)) {
				t.Fatalf("the prepare Job's sample has no line %q", keepLine)
			}
			raw = bytes.Replace(raw, []byte(keepLine), []byte("--keep="+crontabs+"="+r.keep), 1)
		}
		files["restow/prepare-job/"+name] = raw
	}
	return files
}

// TestFluxLayoutOfGitopsMd runs docs/gitops.md's Flux layout: a
// Kustomization crontab-prepare (wait: true) of the prepare Job's sample,
// and crontab-crds (wait: true, dependsOn crontab-prepare) of the CRD and,
// where restow's operator runs, its StorageMigration, over three releases
// in git: v1beta1 stored, the switch to v1, v1beta1 dropped. No kubelet
// runs here: the test runs each Job's command as the Job's ServiceAccount,
// as the Job's Pod would, and writes the Job's status as the Job
// controller would.
//   - With restow's operator at its defaults: after the switch,
//     crontab-crds is Ready only once the StorageMigration is, and the
//     release that drops v1beta1 then applies.
//   - Without it: the prepare Job of the release that drops v1beta1
//     migrates every object in its own process, and crontab-crds applies
//     that release only after the Job succeeded.
func TestFluxLayoutOfGitopsMd(t *testing.T) {
	for _, restow := range []bool{true, false} {
		t.Run(map[bool]string{true: "with restow's operator", false: "prepare alone"}[restow], func(t *testing.T) {
			t.Parallel()
			cp, f := start(t, restow)
			if err := cp.EnsureNamespaces(t.Context(), "restow-prepare"); err != nil {
				t.Fatal(err)
			}
			jobs := runJobs(t, cp)
			rev := f.publish(t, layoutReleases[0].name, layoutReleases[0].files(t, restow))
			f.kustomization(t, "crontab-prepare", map[string]any{
				"interval": "10m", "retryInterval": retryInterval, "path": "./restow/prepare-job/flux", "prune": true,
				"wait": true, "timeout": "30m",
			})
			f.kustomization(t, "crontab-crds", map[string]any{
				"interval": "10m", "retryInterval": retryInterval, "path": "./crds/crontabs", "prune": true,
				"wait": true, "timeout": "30m", "dependsOn": []any{map[string]any{"name": "crontab-prepare"}},
			})
			f.awaitReady(t, "crontab-crds", rev, time.Minute)
			fx := testenv.Fixture{Env: cp, Group: "stable.example.com", Kind: "CronTab", Plural: "crontabs", Namespaced: true}
			const n = 300
			fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any {
				return map[string]any{"cronSpec": "* * * * */5", "image": "registry.example.com/report:1.4", "replicas": int64(i)}
			}, "team-a")

			rev = f.publish(t, layoutReleases[1].name, layoutReleases[1].files(t, restow))
			if restow {
				awaitReadyAfterMigration(t, f, rev)
			} else {
				f.awaitReady(t, "crontab-crds", rev, time.Minute)
			}

			ran := jobs.count()
			third := f.publish(t, layoutReleases[2].name, layoutReleases[2].files(t, restow))
			run := jobs.await(t, ran+1, settleWindow+time.Minute)
			if s, err := f.read(t.Context(), "crontab-crds"); err != nil || s.lastAttempted != rev {
				t.Errorf("when the prepare Job of %q ended, crontab-crds had attempted %q (%v), want %s: it must wait for crontab-prepare",
					layoutReleases[2].name, s.lastAttempted, err, rev)
			}
			want := crontabs + ": prepared: status.storedVersions lists v1 alone"
			if restow {
				want = crontabs + ": ok, nothing to prepare"
			}
			if run.code != 0 || !strings.Contains(run.out, want) {
				t.Errorf("the prepare Job exited %d, want 0 saying %q", run.code, want)
			}
			f.awaitReady(t, "crontab-prepare", third, time.Minute)
			f.awaitReady(t, "crontab-crds", third, time.Minute)
			fx.AssertAllStoredAt(t, "v1", n)
			fx.AssertStoredVersions(t, "v1")
		})
	}
}

// awaitReadyAfterMigration waits until crontab-crds is Ready at revision,
// after the storage switch: Flux's wait reads the StorageMigration with
// kstatus, so crontab-crds must not be Ready before the StorageMigration
// is Ready at v1 (its Ready of before the switch, at v1beta1, does not
// count) and status.storedVersions lists v1 alone, at any look.
func awaitReadyAfterMigration(t *testing.T, f *flux, revision string) {
	t.Helper()
	var k status
	m := &migrationv1alpha1.StorageMigration{}
	testenv.WaitProgress(t, "crontab-crds Ready after its StorageMigration", settleWindow+time.Minute, func(ctx context.Context) (bool, string, error) {
		var err error
		if k, err = f.read(ctx, "crontab-crds"); err != nil {
			return false, "", err
		}
		if err := f.cp.Client.Get(ctx, client.ObjectKey{Name: crontabs}, m); client.IgnoreNotFound(err) != nil {
			return false, "", err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := f.cp.Client.Get(ctx, client.ObjectKey{Name: crontabs}, crd); err != nil {
			return false, "", err
		}
		migrated := m.ReadyAt("v1") && slices.Equal(crd.Status.StoredVersions, []string{"v1"})
		done := k.ready == "True" && k.lastApplied == revision
		if done && !migrated {
			t.Errorf("crontab-crds is Ready at %s while its StorageMigration is not Ready at v1 (%s) or status.storedVersions is %v",
				revision, m.Status.ProgressSummary, crd.Status.StoredVersions)
		}
		return done, fmt.Sprintf("%s; StorageMigration: %s; storedVersions %v", k, m.Status.ProgressSummary, crd.Status.StoredVersions), nil
	})
	ready := apimeta.FindStatusCondition(m.Status.Conditions, "Ready")
	if ready == nil || k.readySince.Before(ready.LastTransitionTime.Truncate(time.Second)) {
		t.Fatalf("crontab-crds Ready since %s, its StorageMigration's Ready %+v: want the Kustomization Ready after it", k.readySince, ready)
	}
	t.Logf("crontab-crds Ready since %s; its StorageMigration Ready since %s: %s", k.readySince, ready.LastTransitionTime, ready.Message)
}

// jobRun is one run of a prepare Job's command.
type jobRun struct {
	code int
	out  string
}

// jobs runs each prepare Job that Flux creates, once, as its Pod would.
type jobs struct {
	mu   sync.Mutex
	runs []jobRun
	// out is the output of the run under way, or of the last one.
	out testenv.LockedBuffer
}

// runJobs runs, until the test ends, each new Job restow-prepare once: its
// command as its ServiceAccount, then the Job's status as the Job
// controller writes it.
func runJobs(t *testing.T, cp *testenv.Env) *jobs {
	t.Helper()
	j := &jobs{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		var seen []types.UID
		for ctx.Err() == nil {
			job := &batchv1.Job{}
			err := cp.Client.Get(ctx, client.ObjectKey{Namespace: "restow-prepare", Name: "restow-prepare"}, job)
			if err == nil && job.DeletionTimestamp == nil && !slices.Contains(seen, job.UID) {
				seen = append(seen, job.UID)
				run := runJob(ctx, t, cp, job, &j.out)
				j.mu.Lock()
				j.runs = append(j.runs, run)
				j.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return j
}

// count is how many Jobs have run.
func (j *jobs) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.runs)
}

// await waits until the n-th Job has run, and returns that run.
func (j *jobs) await(t *testing.T, n int, stall time.Duration) jobRun {
	t.Helper()
	// Progress is what the run under way printed so far (its pass's
	// progress lines), quiet only through the settle window.
	testenv.WaitProgress(t, "the prepare Job", stall, func(context.Context) (bool, string, error) {
		j.mu.Lock()
		defer j.mu.Unlock()
		return len(j.runs) >= n, fmt.Sprintf("%d runs; %d bytes of output", len(j.runs), len(j.out.String())), nil
	})
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.runs[n-1]
}

// runJob runs job's command as its ServiceAccount and writes its status.
func runJob(ctx context.Context, t *testing.T, cp *testenv.Env, job *batchv1.Job, progress *testenv.LockedBuffer) jobRun {
	spec := job.Spec.Template.Spec
	if len(spec.Containers) != 1 || !slices.Equal(spec.Containers[0].Command, []string{"/kubectl-restow"}) {
		t.Errorf("the prepare Job runs %+v, want one container running the image's /kubectl-restow", spec.Containers)
		return jobRun{code: -1}
	}
	dir, err := os.MkdirTemp("", "restow-prepare-job")
	if err != nil {
		t.Error(err)
		return jobRun{code: -1}
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfigAs(kubeconfig, serviceaccount.MakeUsername(job.Namespace, spec.ServiceAccountName), serviceaccount.MakeGroupNames(job.Namespace)...); err != nil {
		t.Error(err)
		return jobRun{code: -1}
	}
	args := append(slices.Clone(spec.Containers[0].Args), "--kubeconfig="+kubeconfig, "--cache-dir="+filepath.Join(dir, "cache"))
	var out bytes.Buffer
	started := metav1.Now()
	w := io.MultiWriter(&out, progress)
	code := cli.Execute(ctx, args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: w, ErrOut: w})
	t.Logf("/kubectl-restow %s: exit %d\n%s", strings.Join(args, " "), code, out.String())
	ended := metav1.Now()
	job.Status.StartTime = &started
	reason, complete := batchv1.JobReasonCompletionsReached, []batchv1.JobConditionType{batchv1.JobSuccessCriteriaMet, batchv1.JobComplete}
	if code == 0 {
		job.Status.Succeeded = 1
		job.Status.CompletionTime = &ended
	} else {
		job.Status.Failed = 1
		reason, complete = batchv1.JobReasonBackoffLimitExceeded, []batchv1.JobConditionType{batchv1.JobFailureTarget, batchv1.JobFailed}
	}
	for _, c := range complete {
		job.Status.Conditions = append(job.Status.Conditions, batchv1.JobCondition{Type: c, Status: corev1.ConditionTrue, Reason: reason, LastProbeTime: ended, LastTransitionTime: ended})
	}
	if err := cp.Client.Status().Update(ctx, job); err != nil && ctx.Err() == nil {
		t.Errorf("writing the prepare Job's status: %v", err)
	}
	return jobRun{code: code, out: out.String()}
}
