// Package demo is restow's demo: on a throw-away control plane it starts
// itself, it switches a CRD's storage version with thousands of objects in
// place, lets the operator migrate them, and proves from etcd that every
// object was re-stored and the old version can be removed.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/controlplane"
	"github.com/restow/restow/internal/logging"
	"github.com/restow/restow/internal/operator"
)

// The demo's control plane ends requests after demoRequestTimeout, so writes
// that began on a CRD's old storage end within twice that, and the settle
// window can be short: demoSettleWindow instead of the 2 minutes that the
// API server's default --request-timeout of 60 s needs.
const (
	demoRequestTimeout = 5 * time.Second
	demoSettleWindow   = 2 * demoRequestTimeout
)

// The demo CRD.
const (
	group   = "stable.example.com"
	plural  = "crontabs"
	crdName = plural + "." + group
)

// Options tune the demo.
type Options struct {
	// Objects is how many CronTabs are created.
	Objects int
	// CRDDirectory holds restow's CRD (config/crd/bases).
	CRDDirectory string
	// Out receives the narration.
	Out io.Writer
}

// Run runs the demo. It needs KUBEBUILDER_ASSETS to point at kube-apiserver
// and etcd (make demo builds them), and tears everything down when it
// returns, also when ctx is cancelled (Ctrl-C).
func Run(ctx context.Context, opts Options) (err error) {
	start := time.Now()
	out := opts.Out
	dir, err := os.MkdirTemp("", "restow-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	logPath := filepath.Join(dir, "operator.log")
	if err := routeLogs(logPath); err != nil {
		return err
	}
	fmt.Fprintf(out, "restow demo: %d objects of a CRD whose storage version changes\n", opts.Objects)
	step(out, 1, "Starting a throw-away control plane: etcd and kube-apiserver, built from source, on 127.0.0.1.")
	env, err := controlplane.Start(controlplane.Options{
		CRDDirectoryPaths: []string{opts.CRDDirectory},
		APIServerArgs:     map[string]string{"request-timeout": demoRequestTimeout.String()},
	})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "Stopping the control plane.")
		err = errors.Join(err, env.Stop())
	}()
	if err := tellKubeconfig(env, out, filepath.Join(dir, "kubeconfig")); err != nil {
		return err
	}
	show := &demoEnv{env: env, out: out}
	if err := createAndSwitch(ctx, show, opts.Objects); err != nil {
		return err
	}
	step(out, 5, "Starting the restow operator (in-process, automatic migration on; its log: %s).", logPath)
	fmt.Fprintf(out, "   Before it prunes, restow waits out a settle window from the switch, so that writes that began on the\n"+
		"   old storage have ended, then rewrites again what others wrote meanwhile. This control plane runs\n"+
		"   kube-apiserver with --request-timeout=%s, so the window is %s (twice that); with the default 60s, it is 2m.\n",
		demoRequestTimeout, demoSettleWindow)
	// Status every second, so the progress moves along.
	stopOperator, err := operator.Run(ctx, env.Config, env.Scheme, controllers.Options{
		StatusInterval:   time.Second,
		StalledRetryBase: 5 * time.Second,
		StalledRetryMax:  time.Minute,
		SettleWindow:     demoSettleWindow,
		AutoMigrate:      true,
		DeferToStandard:  true,
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopOperator()) }()
	if err := followMigration(ctx, env, out, opts.Objects); err != nil {
		return err
	}
	if err := proveAndRemove(ctx, show, opts.Objects); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nDone in %s.\n", time.Since(start).Round(time.Second))
	return nil
}

// tellKubeconfig writes the control plane's kubeconfig to path and says
// how kubectl reaches it while the demo runs.
func tellKubeconfig(env *controlplane.ControlPlane, out io.Writer, path string) error {
	if err := env.WriteKubeconfig(path); err != nil {
		return err
	}
	if disco, err := discovery.NewDiscoveryClientForConfig(env.Config); err == nil {
		if v, err := disco.ServerVersion(); err == nil {
			fmt.Fprintf(out, "   kube-apiserver %s is up. While the demo runs, kubectl reaches it with:\n", v.GitVersion)
		}
	}
	fmt.Fprintf(out, "     export KUBECONFIG=%s\n", path)
	return nil
}

// createAndSwitch is steps 2 to 4: the CRDs, n CronTabs at v1beta1, and
// the storage switch to v1, after which removing v1beta1 is refused.
func createAndSwitch(ctx context.Context, show *demoEnv, n int) error {
	env, out := show.env, show.out
	step(out, 2, "Installing restow's StorageMigration CRD and the demo CRD %s:\n   v1beta1 is its storage version, v1 is served too.", crdName)
	if err := env.InstallCRD(ctx, cronTabCRD()); err != nil {
		return err
	}
	namespaces := []string{"team-a", "team-b", "team-c", "team-d", "team-e"}
	step(out, 3, "Creating %d CronTabs at v1beta1 in %d namespaces.", n, len(namespaces))
	t0 := time.Now()
	if err := env.EnsureNamespaces(ctx, namespaces...); err != nil {
		return err
	}
	err := env.CreateObjects(ctx, n, func(i int) client.Object {
		return cronTab(namespaces[i%len(namespaces)], fmt.Sprintf("crontab-%05d", i))
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   Created in %s.\n", time.Since(t0).Round(100*time.Millisecond))
	if err := show.stored(ctx, map[string]int{"v1beta1": n}); err != nil {
		return err
	}

	step(out, 4, "The next release of the operator that owns %s switches its storage version to v1.", crdName)
	if err := env.SetStorageVersion(ctx, crdName, "v1"); err != nil {
		return err
	}
	if err := show.storedVersions(ctx); err != nil {
		return err
	}
	if err := show.stored(ctx, map[string]int{"v1beta1": n}); err != nil {
		return err
	}
	fmt.Fprintln(out, "   The switch rewrote nothing. Removing v1beta1 from the CRD now is refused:")
	refused := removeVersion(ctx, env, "v1beta1")
	if refused == nil {
		return errors.New("the API server accepted removing v1beta1 before the migration")
	}
	fmt.Fprintf(out, "     %s\n", refused)
	return nil
}

// followMigration waits for the StorageMigration the operator creates by
// itself and follows it to Ready, as kubectl restow status -w would.
func followMigration(ctx context.Context, env *controlplane.ControlPlane, out io.Writer, n int) error {
	sm := &migrationv1alpha1.StorageMigration{}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: crdName}, sm)
		return err == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("waiting for the automatic StorageMigration: %w", err)
	}
	fmt.Fprintf(out, "   restow saw status.storedVersions and created StorageMigration %s by itself.\n", sm.Name)
	sm, outcome, err := cli.Follow(ctx, env.Client, crdName, int64(n), cli.ReadyAt("v1"), out)
	switch {
	case err != nil:
		return err
	case outcome != cli.Succeeded:
		return fmt.Errorf("StorageMigration %s ended %v: %+v", crdName, outcome, sm.Status.Conditions)
	}
	last := sm.Status.LastPass
	fmt.Fprintf(out, "   StorageMigration %s is Ready: %d objects in %s including the settle window, %d re-encoded, %d already stored,\n"+
		"   %d changed by others meanwhile, %d rewritten again after the window; it removed %v from status.storedVersions.\n",
		sm.Name, last.Listed, last.CompletionTime.Sub(last.StartTime.Time).Round(time.Second), last.Migrated, last.AlreadyStored, last.Skipped, last.Rechecked, last.PrunedVersions)
	return nil
}

// proveAndRemove is steps 6 and 7: every object stored at v1, read from
// etcd, and the release that removes v1beta1 accepted, every CronTab read
// back.
func proveAndRemove(ctx context.Context, show *demoEnv, n int) error {
	env, out := show.env, show.out
	step(out, 6, "The proof, read from etcd (an API read converts objects and proves nothing about storage):")
	if err := show.stored(ctx, map[string]int{"v1": n}); err != nil {
		return err
	}
	if err := show.storedVersions(ctx); err != nil {
		return err
	}

	step(out, 7, "The release after removes v1beta1 from the CRD.")
	if err := removeVersion(ctx, env, "v1beta1"); err != nil {
		return fmt.Errorf("removing v1beta1 after the migration: %w", err)
	}
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion(group + "/v1")
	list.SetKind("CronTabList")
	if err := env.Client.List(ctx, list); err != nil {
		return fmt.Errorf("listing CronTabs at v1: %w", err)
	}
	if len(list.Items) != n {
		return fmt.Errorf("the API lists %d CronTabs, want %d", len(list.Items), n)
	}
	fmt.Fprintf(out, "   Accepted: the CRD now has v1 only, and all %d CronTabs read back through the API.\n", len(list.Items))
	return nil
}

func step(out io.Writer, n int, format string, args ...any) {
	fmt.Fprintf(out, "\n%d. %s\n", n, fmt.Sprintf(format, args...))
}

// routeLogs sends the operator's and client-go's logs to a file, so the
// narration stays readable.
func routeLogs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	log, err := logging.NewWithSink(logging.Options{Level: "info", Encoding: "console"}, f)
	if err != nil {
		return err
	}
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	return nil
}

type demoEnv struct {
	env *controlplane.ControlPlane
	out io.Writer
}

// stored reads every CronTab from etcd and checks it is stored as want
// says (versions to counts).
func (d *demoEnv) stored(ctx context.Context, want map[string]int) error {
	counts, err := d.env.StoredVersions(ctx, group, plural)
	if err != nil {
		return err
	}
	for _, v := range []string{"v1beta1", "v1"} {
		if n := counts[group+"/"+v]; n > 0 {
			fmt.Fprintf(d.out, "   etcd: %d CronTabs stored at %s/%s.\n", n, group, v)
		}
	}
	for v, n := range want {
		if counts[group+"/"+v] != n || len(counts) != len(want) {
			return fmt.Errorf("etcd holds %v, want %d at %s/%s", counts, n, group, v)
		}
	}
	return nil
}

func (d *demoEnv) storedVersions(ctx context.Context) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := d.env.Client.Get(ctx, client.ObjectKey{Name: crdName}, crd); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "   CRD status.storedVersions: %v\n", crd.Status.StoredVersions)
	return nil
}

func removeVersion(ctx context.Context, env *controlplane.ControlPlane, version string) error {
	return env.UpdateCRD(ctx, crdName, func(crd *apiextensionsv1.CustomResourceDefinition) {
		crd.Spec.Versions = slices.DeleteFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == version })
	})
}

func cronTabCRD() *apiextensionsv1.CustomResourceDefinition {
	schema := &apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {
				Type: "object",
				Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"cronSpec": {Type: "string"},
					"image":    {Type: "string"},
					"replicas": {Type: "integer"},
				},
			},
		},
	}
	crd := controlplane.NewCRD(group, "CronTab", plural, apiextensionsv1.NamespaceScoped,
		controlplane.CRDVersion{Name: "v1beta1", Served: true, Storage: true, Schema: schema},
		controlplane.CRDVersion{Name: "v1", Served: true, Schema: schema})
	crd.Spec.Names.ShortNames = []string{"ct"}
	return crd
}

func cronTab(namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"cronSpec": "*/5 * * * *", "image": "registry.example.com/report:1.4", "replicas": int64(1)},
	}}
	u.SetAPIVersion(group + "/v1beta1")
	u.SetKind("CronTab")
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}
