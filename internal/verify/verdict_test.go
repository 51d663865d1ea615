package verify

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/discovery"
	"k8s.io/utils/ptr"
)

func report(versions map[string]int, keys map[string]int) *Report {
	r := &Report{Versions: map[string]*Count{}, Keys: map[string]*Count{}}
	for v, n := range versions {
		r.Versions[v] = &Count{Objects: n, Names: []string{"ns/first"}}
		r.Objects += n
	}
	for k, n := range keys {
		r.Keys[k] = &Count{Objects: n}
	}
	r.KeysAtRevision, r.Snapshot = int64(r.Objects), true
	r.APIObjects = ptr.To(int64(r.Objects))
	return r
}

// counted is a report whose etcd and API counts are given.
func counted(etcd int64, api *int64, apiError string) *Report {
	r := report(map[string]int{"example.com/v1": int(etcd)}, nil)
	r.Snapshot = true
	r.KeysAtRevision, r.APIObjects, r.APIError, r.Revision, r.KeyPrefix = etcd, api, apiError, 7, "/kubernetes.io/example.com/widgets/"
	return r
}

// shared marks r as read with --etcd-shared: the API's first object, ns/a,
// was written at apiRevision, and etcd's key of it at etcdRevision.
func shared(r *Report, apiRevision, etcdRevision int64) *Report {
	r.SharedEtcd = true
	if apiRevision != 0 {
		r.APIFirst, r.EtcdFirst, r.APIFirstRevision, r.APIFirstInEtcd = "ns/a", "ns/0", apiRevision, etcdRevision
	}
	return r
}

// widgets is a CRD whose storage version is v1.
func widgets(stored ...string) APIView {
	return APIView{Group: "example.com", Kind: "Widget", CRD: &CRDView{
		Name: "widgets.example.com", StorageVersion: "v1", StoredVersions: stored, Versions: []string{"v1beta1", "v1"},
	}}
}

func TestJudge(t *testing.T) {
	deploymentsV1 := APIView{Group: "apps", Kind: "Deployment", StorageVersionHash: discovery.StorageVersionHash("apps", "v1", "Deployment")}
	for _, tc := range []struct {
		name   string
		report *Report
		api    APIView
		want   Expectations
		// findings: severity and a part of the message, in order.
		findings   []string
		mismatches []string
	}{
		{
			name:   "migrated and pruned",
			report: report(map[string]int{"example.com/v1": 10}, nil),
			api:    widgets("v1"), want: Expectations{Version: "v1"},
			findings: []string{"ok: safe to remove v1beta1", "ok: 10 objects stored at v1, the storage version"},
		},
		{
			name:   "mid-migration",
			report: report(map[string]int{"example.com/v1": 7, "example.com/v1beta1": 3}, nil),
			api:    widgets("v1beta1", "v1"), want: Expectations{Version: "v1"},
			findings:   []string{"pending: not safe to remove v1beta1: 3 objects still stored at it (ns/first, …)", "ok: 7 objects"},
			mismatches: []string{"3 objects stored at example.com/v1beta1, not example.com/v1 (ns/first, …)"},
		},
		{
			name:     "migrated, not yet pruned",
			report:   report(map[string]int{"example.com/v1": 10}, nil),
			api:      widgets("v1beta1", "v1"),
			findings: []string{"pending: etcd holds no object at v1beta1, but status.storedVersions still lists it", "ok: 10 objects"},
		},
		{
			name:     "pruned too early",
			report:   report(map[string]int{"example.com/v1": 7, "example.com/v1beta1": 3}, nil),
			api:      widgets("v1"),
			findings: []string{"danger: status.storedVersions no longer lists v1beta1 but etcd holds 3 objects at it: put it back before removing the version", "ok: 7 objects"},
		},
		{
			name:   "version already removed",
			report: report(map[string]int{"example.com/v1": 7, "example.com/v1alpha1": 2}, nil),
			api:    widgets("v1"),
			findings: []string{"ok: safe to remove v1beta1", "danger: etcd holds 2 objects at v1alpha1, a version the CRD no longer has",
				"ok: 7 objects"},
		},
		{
			name:   "encrypted custom resources",
			report: report(map[string]int{"example.com/v1": 7, EncryptedVersion: 3}, nil),
			api:    widgets("v1"), want: Expectations{Version: "v1"},
			findings: []string{"cannot-tell: cannot tell the version of 3 objects (3 encrypted)", "cannot-tell: no readable object is stored at v1beta1",
				"ok: 7 objects"},
			mismatches: []string{"3 objects stored at (encrypted), not example.com/v1 (ns/first, …)"},
		},
		{
			name:     "built-in at its storage version",
			report:   report(map[string]int{"apps/v1": 4}, nil),
			api:      deploymentsV1,
			findings: []string{"ok: 4 objects stored at apps/v1, the version the API server stores at"},
		},
		{
			name:   "built-in left at an older version",
			report: report(map[string]int{"apps/v1": 4, "apps/v1beta2": 1}, nil),
			api:    deploymentsV1, want: Expectations{Version: "v1"},
			findings:   []string{"ok: 4 objects stored at apps/v1", "pending: 1 object stored at apps/v1beta2, not the version the API server stores at now"},
			mismatches: []string{"1 object stored at apps/v1beta2, not apps/v1 (ns/first)"},
		},
		{
			name:     "built-in without a hash",
			report:   report(map[string]int{"v1": 4}, nil),
			api:      APIView{Kind: "Secret"},
			findings: []string{"cannot-tell: the API server publishes no storageVersionHash", "cannot-tell: 4 objects stored at v1"},
		},
		{
			name: "key gate",
			report: func() *Report {
				r := report(map[string]int{EncryptedVersion: 5}, map[string]int{"aescbc:key1": 2, "aescbc:key2": 3})
				r.NotUnderKey = &Count{Objects: 2, Names: []string{"ns/a", "ns/b"}}
				return r
			}(),
			api: APIView{Kind: "Secret", StorageVersionHash: discovery.StorageVersionHash("", "v1", "Secret")}, want: Expectations{Key: KeyWant{Provider: "aescbc", Name: "key2", Given: "aescbc:key2"}},
			findings:   []string{"cannot-tell: cannot tell the version of 5 objects (5 encrypted)"},
			mismatches: []string{"2 objects not stored under key aescbc:key2 (ns/a, ns/b)"},
		},
		{
			name: "a KMS v2 provider's objects under two key IDs",
			report: func() *Report {
				r := report(map[string]int{EncryptedVersion: 5}, nil)
				r.NotUnderKey, r.keyIDs = &Count{}, map[string]int{"k1": 2, "k2": 3}
				return r
			}(),
			api: APIView{Kind: "Secret", StorageVersionHash: discovery.StorageVersionHash("", "v1", "Secret")}, want: Expectations{Key: KeyWant{Provider: "kmsv2", Name: "p", Given: "kmsv2:p"}},
			findings:   []string{"cannot-tell: cannot tell the version of 5 objects (5 encrypted)"},
			mismatches: []string{"the objects under kmsv2:p are under 2 KMS v2 key IDs (k1 2, k2 3): a rotation is not finished; give the key ID to gate on it"},
		},
		{
			name:       "fewer keys in etcd than the API lists",
			report:     counted(0, ptr.To[int64](3), ""),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: etcd holds 0 keys under /kubernetes.io/example.com/widgets/ at revision 7, but the API lists 3 objects at that revision: this read does not see them all. Check --etcd-prefix"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name:       "no API count",
			report:     counted(3, nil, ""),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: etcd's count under /kubernetes.io/example.com/widgets/ was held against no count of the API's"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name:       "the API cannot list",
			report:     counted(3, nil, "the server could not find the requested resource"),
			api:        widgets("v1beta1", "v1"),
			findings:   []string{"danger: the API could not list this resource at etcd's revision 7 (the server could not find the requested resource), while etcd holds 3 objects under /kubernetes.io/example.com/widgets/"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name: "etcd compacted the revision mid-read",
			report: func() *Report {
				r := counted(3, ptr.To[int64](3), "")
				r.Snapshot = false
				return r
			}(),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: etcd compacted revision 7 while this read went on"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name: "another etcd's objects, as many",
			report: func() *Report {
				r := counted(3, ptr.To[int64](3), "")
				r.APIFirst, r.EtcdFirst = "ns/a", "other/z"
				return r
			}(),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: the first object etcd holds under /kubernetes.io/example.com/widgets/ is other/z, but the first the API lists at revision 7 is ns/a"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name:       "more keys in etcd than the API lists",
			report:     counted(4, ptr.To[int64](3), ""),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: etcd holds 4 keys under /kubernetes.io/example.com/widgets/ at revision 7, but the API lists 3 objects at that revision: these keys are not all this API server's"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name: "as many keys, the first object the API lists written at another revision there",
			report: func() *Report {
				r := counted(3, ptr.To[int64](3), "")
				r.APIFirst, r.EtcdFirst, r.APIFirstRevision, r.APIFirstInEtcd = "ns/a", "ns/a", 5, 6
				return r
			}(),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: the first object the API lists at revision 7, ns/a, was last written at revision 5, but etcd's key /kubernetes.io/example.com/widgets/ns/a was last written at revision 6"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name:     "more keys in a shared etcd, the first object the API lists found at its revision",
			report:   shared(counted(4, ptr.To[int64](3), ""), 5, 5),
			api:      widgets("v1"),
			findings: []string{"cannot-tell: etcd holds 4 keys under /kubernetes.io/example.com/widgets/ at revision 7, the API lists 3 objects at that revision (--etcd-shared)", "ok: safe to remove v1beta1", "ok: 4 objects stored at v1"},
		},
		{
			name:       "a shared etcd, the first object the API lists written at another revision there",
			report:     shared(counted(4, ptr.To[int64](3), ""), 5, 6),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: the first object the API lists at revision 7, ns/a, was last written at revision 5, but etcd's key /kubernetes.io/example.com/widgets/ns/a was last written at revision 6"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name:       "a shared etcd, the first object the API lists not there",
			report:     shared(counted(4, ptr.To[int64](3), ""), 5, 0),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: the first object the API lists at revision 7, ns/a, was last written at revision 5, but etcd holds no key /kubernetes.io/example.com/widgets/ns/a"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name:       "a shared etcd whose prefix holds keys where the API lists none",
			report:     shared(counted(2, ptr.To[int64](0), ""), 0, 0),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: etcd holds 2 keys under /kubernetes.io/example.com/widgets/ at revision 7, but the API lists 0 objects: with --etcd-shared the prefix is proven by the first object the API lists, and it lists none"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
		{
			name: "the API gave no count",
			report: func() *Report {
				r := counted(3, nil, "the API gave no count: listing example.com/v1 gave no remainingItemCount")
				r.APICountUnknown = true
				return r
			}(),
			api:        widgets("v1"),
			findings:   []string{"unaccounted: cannot tell: the API listed this resource at revision 7 without saying how many objects it holds"},
			mismatches: []string{"etcd's read does not hold every object the API lists: nothing is proven"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.report.Resource = schema.GroupResource{Group: tc.api.Group}
			got := Judge(tc.report, tc.api, tc.want)
			var findings []string
			for _, f := range got.Findings {
				findings = append(findings, string(f.Severity)+": "+f.Message)
			}
			if len(findings) != len(tc.findings) {
				t.Fatalf("findings:\n%s\nwant:\n%s", strings.Join(findings, "\n"), strings.Join(tc.findings, "\n"))
			}
			for i, want := range tc.findings {
				if !strings.HasPrefix(findings[i], want) {
					t.Errorf("finding %d = %q, want it to start with %q", i, findings[i], want)
				}
			}
			if !slices.Equal(got.Mismatches, tc.mismatches) {
				t.Errorf("mismatches = %q, want %q", got.Mismatches, tc.mismatches)
			}
			danger := slices.ContainsFunc(tc.findings, func(f string) bool { return strings.HasPrefix(f, "danger") })
			if got.Failed() != danger {
				t.Errorf("Failed() = %v, want %v", got.Failed(), danger)
			}
			unaccounted := slices.ContainsFunc(tc.findings, func(f string) bool { return strings.HasPrefix(f, "unaccounted") })
			if got.Unaccounted() != unaccounted {
				t.Errorf("Unaccounted() = %v, want %v", got.Unaccounted(), unaccounted)
			}
		})
	}
}

func TestKeyPrefix(t *testing.T) {
	for _, tc := range []struct {
		gr     schema.GroupResource
		crd    bool
		prefix string
		want   string
	}{
		{schema.GroupResource{Group: "example.com", Resource: "widgets"}, true, "", "/registry/example.com/widgets/"},
		{schema.GroupResource{Resource: "secrets"}, false, "", "/registry/secrets/"},
		{schema.GroupResource{Group: "apps", Resource: "deployments"}, false, "/registry", "/registry/deployments/"},
		{schema.GroupResource{Resource: "nodes"}, false, "", "/registry/minions/"},
		{schema.GroupResource{Resource: "services"}, false, "", "/registry/services/specs/"},
		{schema.GroupResource{Resource: "endpoints"}, false, "", "/registry/services/endpoints/"},
		{schema.GroupResource{Resource: "replicationcontrollers"}, false, "", "/registry/controllers/"},
		{schema.GroupResource{Group: "networking.k8s.io", Resource: "ingresses"}, false, "", "/registry/ingress/"},
		{schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}, false, "", "/registry/apiextensions.k8s.io/customresourcedefinitions/"},
		{schema.GroupResource{Group: "apiregistration.k8s.io", Resource: "apiservices"}, false, "/cluster-a/", "/cluster-a/apiregistration.k8s.io/apiservices/"},
	} {
		if got := KeyPrefix(tc.prefix, tc.gr, tc.crd); got != tc.want {
			t.Errorf("KeyPrefix(%q, %s, %v) = %q, want %q", tc.prefix, tc.gr, tc.crd, got, tc.want)
		}
	}
}
