package migrator

import (
	"context"
	"errors"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/restow/restow/internal/storedversions"
)

// historyCRD is a CRD state: uid, storage version, generation and
// resourceVersion.
func historyCRD(uid, storage string, generation int64, rv string) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", UID: types.UID("uid-" + uid), Generation: generation, ResourceVersion: rv},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
			{Name: "v1beta1", Served: true, Storage: storage == "v1beta1"},
			{Name: "v1", Served: true, Storage: storage == "v1"},
		}},
	}
}

// deleting marks crd as being deleted.
func deleting(crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinition {
	now := metav1.Now()
	crd.DeletionTimestamp = &now
	return crd
}

// TestCRDHistory: a generation that moved is accepted only when the watch
// delivered the very state read live and every state since the start kept
// the storage version; a state with another storage version, UID or a
// deletion breaks the proof for good; without a watch only the generation
// decides.
func TestCRDHistory(t *testing.T) {
	start := &CRDState{Name: "widgets.example.com", UID: "uid-a", StorageVersion: "v1", Generation: 3, ResourceVersion: "100"}
	for _, tc := range []struct {
		name     string
		watching bool
		events   []watch.Event
		live     *apiextensionsv1.CustomResourceDefinition
		kept     bool
		changed  string
	}{
		{name: "same generation, no watch", live: historyCRD("a", "v1", 3, "150"), kept: true},
		{name: "generation moved, no watch", live: historyCRD("a", "v1", 4, "150")},
		{name: "generation moved, watch delivered it", watching: true,
			events: []watch.Event{{Type: watch.Modified, Object: historyCRD("a", "v1", 4, "120")}, {Type: watch.Modified, Object: historyCRD("a", "v1", 5, "150")}},
			live:   historyCRD("a", "v1", 5, "150"), kept: true},
		{name: "generation moved, watch behind the live read", watching: true,
			events: []watch.Event{{Type: watch.Modified, Object: historyCRD("a", "v1", 4, "120")}},
			live:   historyCRD("a", "v1", 5, "150")},
		{name: "switched away and back", watching: true,
			events: []watch.Event{{Type: watch.Modified, Object: historyCRD("a", "v1beta1", 4, "120")}, {Type: watch.Modified, Object: historyCRD("a", "v1", 5, "150")}},
			live:   historyCRD("a", "v1", 5, "150"), changed: "its storage version became v1beta1 (generation 4)"},
		{name: "deleted and created again", watching: true,
			events: []watch.Event{{Type: watch.Modified, Object: historyCRD("b", "v1", 1, "120")}},
			live:   historyCRD("a", "v1", 3, "100"), changed: "it was deleted and created again"},
		{name: "being deleted", watching: true,
			events: []watch.Event{{Type: watch.Modified, Object: deleting(historyCRD("a", "v1", 4, "120"))}},
			live:   historyCRD("a", "v1", 3, "100"), changed: "it is being deleted"},
		{name: "deleted", watching: true,
			events: []watch.Event{{Type: watch.Deleted, Object: historyCRD("a", "v1", 3, "120")}},
			live:   historyCRD("a", "v1", 3, "100"), changed: "it was deleted"},
		{name: "live read at another storage version", watching: true, live: historyCRD("a", "v1beta1", 3, "100")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &crdHistory{want: start, watching: tc.watching, seen: start.ResourceVersion, generation: start.Generation}
			holds := true
			for _, ev := range tc.events {
				if holds = h.note(ev); !holds {
					break
				}
			}
			if holds != (tc.changed == "") {
				t.Fatalf("note held = %v, want %v", holds, tc.changed == "")
			}
			if tc.changed != "" {
				err := h.err()
				if !errors.Is(err, storedversions.ErrCRDChanged) || !strings.Contains(err.Error(), tc.changed) {
					t.Fatalf("err = %v, want ErrCRDChanged saying %q", err, tc.changed)
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			if !tc.kept && tc.changed == "" && tc.watching {
				// Only the wait for the watch to catch up would pass; it
				// must not accept when it gives up.
				cancel()
			}
			defer cancel()
			if got := h.kept(ctx, tc.live); got != tc.kept {
				t.Fatalf("kept = %v, want %v", got, tc.kept)
			}
			if !tc.kept && !errors.Is(h.refused(tc.live), storedversions.ErrCRDChanged) {
				t.Fatalf("refused = %v, want ErrCRDChanged", h.refused(tc.live))
			}
		})
	}
}
