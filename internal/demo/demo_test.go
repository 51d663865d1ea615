package demo_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/restow/restow/internal/demo"
)

// TestDemo runs the demo end to end, smaller. The demo checks etcd itself at
// every step and fails if an object is not stored where it says.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	err := demo.Run(t.Context(), demo.Options{Objects: 400, CRDDirectory: "../../config/crd/bases", Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"etcd: 400 CronTabs stored at stable.example.com/v1beta1.",
		"is invalid: status.storedVersions[0]",
		"created StorageMigration crontabs.stable.example.com by itself",
		"400/400 objects (100%)",
		"etcd: 400 CronTabs stored at stable.example.com/v1.",
		"CRD status.storedVersions: [v1]",
		"Accepted: the CRD now has v1 only, and all 400 CronTabs read back",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}
