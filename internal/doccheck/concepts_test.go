package doccheck

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestConceptsNameEveryReason: the Concepts page names every condition
// reason a StorageMigration can show, as the API defines them.
func TestConceptsNameEveryReason(t *testing.T) {
	api, err := os.ReadFile("../../api/v1alpha1/conditions.go")
	if err != nil {
		t.Fatal(err)
	}
	concepts, err := os.ReadFile("../../docs/concepts.md")
	if err != nil {
		t.Fatal(err)
	}
	reasons := regexp.MustCompile(`(?m)^\s*\w+Reason\s*=\s*"(\w+)"`).FindAllSubmatch(api, -1)
	if len(reasons) == 0 {
		t.Fatal("api/v1alpha1/conditions.go defines no reasons this test can read")
	}
	for _, m := range reasons {
		if !strings.Contains(string(concepts), "`"+string(m[1])+"`") {
			t.Errorf("docs/concepts.md does not name the reason %s", m[1])
		}
	}
}
