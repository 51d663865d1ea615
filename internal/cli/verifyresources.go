package cli

// What verify --all covers, and what discovery did not show it: every
// resource discovery lists that etcd stores, and, for a group version whose
// discovery failed, whether that failure can be left out (an aggregated API
// server's group, whose objects are not in this etcd) or leaves the read
// short of the cluster (exit 7).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// leftOut is a group version that verify --all did not read, and why.
type leftOut struct {
	GroupVersion string `json:"groupVersion"`
	Reason       string `json:"reason"`
}

// aggregation is what the APIService list says of the API groups: those an
// APIService sends to another server, whose objects are not in this etcd,
// and which of their versions it sends. known is false when the list could
// not be read (listing APIServices is forbidden): then no group is known to
// be aggregated or local.
type aggregation struct {
	groups        map[string]bool
	groupVersions map[schema.GroupVersion]bool
	known         bool
}

// storedResources are the resources --all covers: every one discovery shows
// with the list and update verbs (those etcd stores and a pass can
// rewrite), subresources left out; and the group versions whose discovery
// failed but that are shown to be served by an aggregated API server. A
// group version whose discovery failed otherwise fails the read with exit
// 7: its resources may be stored in this etcd, unread.
func storedResources(c *clients, agg aggregation) ([]schema.GroupResource, []leftOut, error) {
	lists, err := c.migrator.Discovery.ServerPreferredResources()
	var left []leftOut
	if err != nil {
		var failed *discovery.ErrGroupDiscoveryFailed
		switch {
		case !errors.As(err, &failed):
			return nil, nil, fmt.Errorf("discovery: %w", err)
		case len(lists) == 0:
			return nil, nil, &exitError{code: ExitUnaccounted, err: fmt.Errorf("discovery listed no API group, so --all cannot cover what etcd stores: %w", err)}
		}
		if left, err = judgeFailedGroups(failed.Groups, agg); err != nil {
			return nil, nil, err
		}
	}
	seen := map[schema.GroupResource]bool{}
	var out []schema.GroupResource
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range list.APIResources {
			gr := schema.GroupResource{Group: gv.Group, Resource: r.Name}
			if strings.Contains(r.Name, "/") || seen[gr] || !slices.Contains(r.Verbs, "list") || !slices.Contains(r.Verbs, "update") {
				continue
			}
			seen[gr] = true
			out = append(out, gr)
		}
	}
	slices.SortFunc(out, func(a, b schema.GroupResource) int { return strings.Compare(a.String(), b.String()) })
	return out, left, nil
}

// judgeFailedGroups says which of the group versions whose discovery
// failed may be left out: those shown to be served by an aggregated API
// server, by the aggregator's own word (a stale group version) or by the
// APIService list. Any other fails the read, naming it; where the
// APIService list could not be read, restow cannot tell, and says how to
// let it.
func judgeFailedGroups(failed map[schema.GroupVersion]error, agg aggregation) ([]leftOut, error) {
	var left []leftOut
	var unread, untold []string
	for _, gv := range slices.SortedFunc(maps.Keys(failed), func(a, b schema.GroupVersion) int { return strings.Compare(a.String(), b.String()) }) {
		var stale discovery.StaleGroupVersionError
		switch {
		case errors.As(failed[gv], &stale):
			left = append(left, leftOut{GroupVersion: gv.String(), Reason: "served by an aggregated API server whose discovery is stale (it does not answer): its objects are not in this etcd"})
		case agg.groupVersions[gv]:
			left = append(left, leftOut{GroupVersion: gv.String(), Reason: fmt.Sprintf("served by an aggregated API server (an APIService) whose discovery failed (%s): its objects are not in this etcd", discoveryFailure(failed[gv]))})
		case !agg.known:
			untold = append(untold, fmt.Sprintf("%s (%s)", gv, discoveryFailure(failed[gv])))
		default:
			unread = append(unread, fmt.Sprintf("%s (%s)", gv, discoveryFailure(failed[gv])))
		}
	}
	// One or the other: untold only where the APIService list is unread.
	switch {
	case len(unread) > 0:
		return nil, &exitError{code: ExitUnaccounted, err: fmt.Errorf("discovery failed for %s, which no aggregated API server serves: its resources may be stored in this etcd, and --all would not read them. Run verify again once its discovery answers, or name the resources to verify", strings.Join(unread, ", "))}
	case len(untold) > 0:
		return nil, &exitError{code: ExitUnaccounted, err: fmt.Errorf("discovery failed for %s, and restow cannot tell whether an aggregated API server serves it (it may not list APIServices): its resources may be stored in this etcd. Let it list apiservices.apiregistration.k8s.io, or name the resources to verify", strings.Join(untold, ", "))}
	}
	return left, nil
}

// unlistedCRDs fails --all when a CRD's resource is not among those
// discovery lists (not established yet, or no version served): the API
// cannot count its objects, so etcd's read of it would be held against
// nothing, and leaving it out would be a pass from partial sight.
func unlistedCRDs(crds []schema.GroupResource, listed []schema.GroupResource) error {
	var missing []string
	for _, gr := range crds {
		if !slices.Contains(listed, gr) {
			missing = append(missing, gr.String())
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return &exitError{code: ExitUnaccounted, err: fmt.Errorf("discovery lists no served version of %s (a CRD not established yet, or with every version served: false): etcd may hold its objects, and the API cannot count them, so --all proves nothing of them. Serve a version, then verify again", strings.Join(missing, ", "))}
}

// discoveryFailure is a failed discovery's cause in a few words.
func discoveryFailure(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return fmt.Sprintf("HTTP %d %s", status.Status().Code, status.Status().Reason)
	}
	return err.Error()
}

// aggregatedGroups reads the APIService list: the API groups APIServices
// send to another server.
func aggregatedGroups(ctx context.Context, c client.Client) (aggregation, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIServiceList"})
	out := aggregation{groups: map[string]bool{}, groupVersions: map[schema.GroupVersion]bool{}}
	if err := c.List(ctx, list); err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
			return out, nil
		}
		return aggregation{}, fmt.Errorf("listing APIServices: %w", err)
	}
	out.known = true
	for _, item := range list.Items {
		if service, _, _ := unstructured.NestedMap(item.Object, "spec", "service"); service != nil {
			group, _, _ := unstructured.NestedString(item.Object, "spec", "group")
			version, _, _ := unstructured.NestedString(item.Object, "spec", "version")
			out.groups[group] = true
			out.groupVersions[schema.GroupVersion{Group: group, Version: version}] = true
		}
	}
	return out, nil
}
