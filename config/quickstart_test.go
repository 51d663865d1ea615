package config_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/testenv"
)

// TestREADMEQuickStart runs the README's quick start as written, command by
// command, on the test control plane: the set-up lines (clone, build,
// PATH) aside, each `kubectl apply -f`, `kubectl wait`, `kubectl restow`
// and `kubectl delete -f` is carried out as kubectl would, and any other
// command fails the test, so that the block cannot grow a step nobody
// runs. The one change: `run` gets --settle-window 2s instead of its
// 2 minutes, since the test's writes ended long before. The removal of
// v1beta1 is refused before `run` (as the README says) and accepted
// after, with every CronTab stored at v1 in etcd.
func TestREADMEQuickStart(t *testing.T) {
	ctx := t.Context()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	start := strings.Index(text, "## Quick start")
	if start < 0 {
		t.Fatal("README.md has no quick start")
	}
	_, block, found := strings.Cut(text[start:], "```sh\n")
	block, _, closed := strings.Cut(block, "```")
	if !found || !closed {
		t.Fatal("README.md's quick start has no sh block")
	}

	before := decodeCRD(t, "crd-storage-v1beta1.yaml")
	name := before.Name
	fx := testenv.Fixture{Env: env, Group: before.Spec.Group, Kind: before.Spec.Names.Kind, Plural: before.Spec.Names.Plural, Namespaced: true}
	t.Cleanup(func() { _ = env.DeleteCRD(context.Background(), name) })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	sample := func(path string) string {
		file, ok := strings.CutPrefix(path, "config/"+samplesDir+"/")
		if !ok {
			t.Fatalf("the quick start applies %s, not a file of config/%s", path, samplesDir)
		}
		return file
	}
	ran := false
	for line := range strings.SplitSeq(block, "\n") {
		line, _, _ = strings.Cut(line, "#")
		args := strings.Fields(line)
		switch {
		case len(args) == 0, args[0] == "git", args[0] == "make", args[0] == "export":
			// Set-up: the build is what CI runs anyway.
		case len(args) == 4 && args[0] == "kubectl" && args[1] == "apply" && args[2] == "-f":
			file := sample(args[3])
			if !strings.HasPrefix(file, "crd-") {
				for _, o := range decodeObjects(t, file) {
					if err := env.Client.Create(ctx, o, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
						t.Fatalf("%s: %v", line, err)
					}
				}
				continue
			}
			crd := decodeCRD(t, file)
			err := env.Client.Create(ctx, crd.DeepCopy())
			if apierrors.IsAlreadyExists(err) {
				if file == "crd-v1beta1-removed.yaml" && !ran {
					t.Fatal("the quick start removes v1beta1 before run")
				}
				err = updateCRD(ctx, crd)
			}
			if err != nil {
				t.Fatalf("%s: %v", strings.TrimSpace(line), err)
			}
			if file == "crd-storage-v1.yaml" {
				// What the README says of the last apply, before run.
				if err := updateCRD(ctx, decodeCRD(t, "crd-v1beta1-removed.yaml")); !apierrors.IsInvalid(err) {
					t.Errorf("removing v1beta1 before run: %v, want it refused", err)
				}
			}
		case len(args) == 5 && args[0] == "kubectl" && args[1] == "wait" && args[4] == "crd/"+name:
			if err := env.WaitForCRD(ctx, name); err != nil {
				t.Fatal(err)
			}
		case len(args) == 4 && args[0] == "kubectl" && args[1] == "delete" && args[2] == "-f" && strings.HasPrefix(sample(args[3]), "crd-"):
			fx.AssertAllStoredAt(t, "v1", 3)
			fx.AssertStoredVersions(t, "v1")
			if err := env.DeleteCRD(ctx, name); err != nil {
				t.Fatal(err)
			}
		case len(args) > 2 && args[0] == "kubectl" && args[1] == "restow" && args[2] == "plan":
			if out := restow(t, kubeconfig, args[2:]...); !strings.Contains(out, name) {
				t.Errorf("plan does not list %s, as the README says it does", name)
			}
		case len(args) > 2 && args[0] == "kubectl" && args[1] == "restow" && args[2] == "run":
			restow(t, kubeconfig, append(args[2:], "--settle-window", "2s")...)
			ran = true
		default:
			t.Fatalf("the quick start runs %q, which this test does not carry out", strings.TrimSpace(line))
		}
	}
	if !ran {
		t.Error("the quick start never runs kubectl restow run")
	}
}
