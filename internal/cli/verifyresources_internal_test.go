package cli

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestJudgeFailedGroups: a group version whose discovery failed is left out
// only where it is shown to be an aggregated API server's; where the
// APIService list could not be read, nothing is.
func TestJudgeFailedGroups(t *testing.T) {
	metrics := schema.GroupVersion{Group: "metrics.k8s.io", Version: "v1beta1"}
	widgets := schema.GroupVersion{Group: "example.com", Version: "v1"}
	unavailable := apierrors.NewServiceUnavailable("the service is unavailable")
	for _, tc := range []struct {
		name     string
		failed   map[schema.GroupVersion]error
		agg      aggregation
		leftOut  int
		errorHas string
	}{
		{"an APIService's group", map[schema.GroupVersion]error{metrics: unavailable}, aggregation{groups: map[string]bool{"metrics.k8s.io": true}, known: true}, 1, ""},
		{"a group no APIService sends elsewhere", map[schema.GroupVersion]error{widgets: unavailable}, aggregation{groups: map[string]bool{"metrics.k8s.io": true}, known: true}, 0,
			"discovery failed for example.com/v1 (HTTP 503 ServiceUnavailable), which no aggregated API server serves"},
		{"both", map[schema.GroupVersion]error{metrics: unavailable, widgets: errors.New("EOF")}, aggregation{groups: map[string]bool{"metrics.k8s.io": true}, known: true}, 0,
			"discovery failed for example.com/v1 (EOF)"},
		{"the APIService list unread", map[schema.GroupVersion]error{metrics: unavailable}, aggregation{groups: map[string]bool{}}, 0,
			"restow cannot tell whether an aggregated API server serves it (it may not list APIServices)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			left, err := judgeFailedGroups(tc.failed, tc.agg)
			var exit *exitError
			switch {
			case tc.errorHas == "" && err != nil:
				t.Fatalf("error %v, want %d left out", err, tc.leftOut)
			case tc.errorHas != "" && (!errors.As(err, &exit) || exit.code != ExitUnaccounted || !strings.Contains(err.Error(), tc.errorHas)):
				t.Fatalf("error %v, want exit %d saying %q", err, ExitUnaccounted, tc.errorHas)
			case len(left) != tc.leftOut:
				t.Fatalf("left out %v, want %d", left, tc.leftOut)
			}
		})
	}
}
