package cli

import (
	"errors"
	"strings"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// TestJudgeFailedGroups: a group version whose discovery failed is left out
// only where it is shown to be an aggregated API server's; where the
// APIService list could not be read, nothing is.
func TestJudgeFailedGroups(t *testing.T) {
	metrics := schema.GroupVersion{Group: "metrics.k8s.io", Version: "v1beta1"}
	widgets := schema.GroupVersion{Group: "example.com", Version: "v1"}
	metricsV1 := schema.GroupVersion{Group: "metrics.k8s.io", Version: "v1"}
	unavailable := apierrors.NewServiceUnavailable("the service is unavailable")
	aggregated := aggregation{groups: map[string]bool{"metrics.k8s.io": true}, groupVersions: map[schema.GroupVersion]bool{metrics: true}, known: true}
	stale, err := staleError(metrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		failed   map[schema.GroupVersion]error
		agg      aggregation
		leftOut  int
		errorHas string
	}{
		{"an APIService's group", map[schema.GroupVersion]error{metrics: unavailable}, aggregated, 1, ""},
		{"a group no APIService sends elsewhere", map[schema.GroupVersion]error{widgets: unavailable}, aggregated, 0,
			"discovery failed for example.com/v1 (HTTP 503 ServiceUnavailable), which no aggregated API server serves"},
		{"both", map[schema.GroupVersion]error{metrics: unavailable, widgets: errors.New("EOF")}, aggregated, 0,
			"discovery failed for example.com/v1 (EOF)"},
		{"the APIService list unread", map[schema.GroupVersion]error{metrics: unavailable}, aggregation{}, 0,
			"restow cannot tell whether an aggregated API server serves it (it may not list APIServices)"},
		{"stale, the APIService list unread", map[schema.GroupVersion]error{metrics: stale}, aggregation{}, 1, ""},
		{"another version of an APIService's group", map[schema.GroupVersion]error{metricsV1: unavailable}, aggregated, 0,
			"discovery failed for metrics.k8s.io/v1 (HTTP 503 ServiceUnavailable), which no aggregated API server serves"},
		{"every version it cannot tell of named", map[schema.GroupVersion]error{widgets: unavailable, metrics: unavailable}, aggregation{}, 0,
			"discovery failed for example.com/v1 (HTTP 503 ServiceUnavailable), metrics.k8s.io/v1beta1 (HTTP 503 ServiceUnavailable), and restow cannot tell"},
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

// staleError is client-go's own error for a group version aggregated
// discovery marks stale (its fields are unexported).
func staleError(gv schema.GroupVersion) (error, error) {
	_, _, failed := discovery.SplitGroupsAndResources(apidiscoveryv2.APIGroupDiscoveryList{Items: []apidiscoveryv2.APIGroupDiscovery{{
		ObjectMeta: metav1.ObjectMeta{Name: gv.Group},
		Versions:   []apidiscoveryv2.APIVersionDiscovery{{Version: gv.Version, Freshness: apidiscoveryv2.DiscoveryFreshnessStale}},
	}}})
	if failed[gv] == nil {
		return nil, errors.New("client-go marked no group version stale")
	}
	return failed[gv], nil
}

// TestUnlistedCRDs: with --all, a CRD whose resource discovery does not
// list fails the run, named.
func TestUnlistedCRDs(t *testing.T) {
	widgets := schema.GroupResource{Group: "example.com", Resource: "widgets"}
	gadgets := schema.GroupResource{Group: "example.com", Resource: "gadgets"}
	if err := unlistedCRDs([]schema.GroupResource{widgets}, []schema.GroupResource{widgets, {Resource: "secrets"}}); err != nil {
		t.Errorf("every CRD listed: %v", err)
	}
	err := unlistedCRDs([]schema.GroupResource{widgets, gadgets}, []schema.GroupResource{widgets})
	var exit *exitError
	if !errors.As(err, &exit) || exit.code != ExitUnaccounted || !strings.Contains(err.Error(), "discovery lists no served version of gadgets.example.com") {
		t.Errorf("a CRD discovery does not list: %v, want exit %d naming it", err, ExitUnaccounted)
	}
}
