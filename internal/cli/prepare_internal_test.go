package cli

import (
	"slices"
	"testing"

	"github.com/restow/restow/internal/preflight"
)

// TestByCRD: manifests that name one CRD (-f and --keep both) are one
// group, prepared one after another; groups keep the order CRDs first
// appear in.
func TestByCRD(t *testing.T) {
	manifests := []preflight.Manifest{{Name: "a.example.com"}, {Name: "b.example.com"}, {Name: "a.example.com"}, {Name: "c.example.com"}}
	got := byCRD(manifests)
	want := [][]int{{0, 2}, {1}, {3}}
	if !slices.EqualFunc(got, want, slices.Equal[[]int]) {
		t.Errorf("byCRD = %v, want %v", got, want)
	}
}
