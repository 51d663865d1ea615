package verify

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/endpoints/discovery"
)

// APIView is what the API says about a resource's storage, beside what etcd
// holds.
type APIView struct {
	// Group and Kind of the resource.
	Group string `json:"group"`
	Kind  string `json:"kind"`
	// CRD is set for custom resources.
	CRD *CRDView `json:"crd,omitempty"`
	// StorageVersionHash is the resource's hash in discovery: it names the
	// group, version and kind the answering API server stores at.
	StorageVersionHash string `json:"storageVersionHash,omitempty"`
}

// CRDView is the CRD of a custom resource.
type CRDView struct {
	Name           string   `json:"name"`
	StorageVersion string   `json:"storageVersion"`
	StoredVersions []string `json:"storedVersions"`
	// Versions are the CRD's spec.versions, in order.
	Versions []string `json:"versions"`
}

// Severity says what a finding asks of the user.
type Severity string

const (
	// Fine means there is nothing to do.
	Fine Severity = "ok"
	// Pending means a migration is not finished; nothing is lost.
	Pending Severity = "pending"
	// Danger means acting on what the API says would lose objects.
	Danger Severity = "danger"
	// CannotTell means etcd holds values whose version cannot be read.
	CannotTell Severity = "cannot-tell"
	// Unaccounted means etcd's read does not hold every object the API
	// lists: what it counted proves nothing.
	Unaccounted Severity = "unaccounted"
)

// Finding is one sentence of a verdict.
type Finding struct {
	Severity Severity `json:"severity"`
	Message  string   `json:"message"`
}

// Expectations turn verify into a gate.
type Expectations struct {
	// Version every object must be stored at ("v1" or "group/v1").
	Version string
	// Key every object must be stored under.
	Key KeyWant
}

// Judgement is the verdict on one resource.
type Judgement struct {
	Findings []Finding `json:"findings"`
	// Mismatches say how etcd differs from the expectations; none means
	// the gate passes.
	Mismatches []string `json:"mismatches,omitempty"`
	// Refused says why --expect-key cannot be held as given: a key's name
	// without its provider.
	Refused string `json:"refused,omitempty"`
}

// Judge compares what etcd holds with what the API says, and with what the
// user expects. It is pure: the report and the view are all it reads.
// Nothing is judged of a read that does not hold every object the API
// lists: it says so, and what to check, and nothing else.
func Judge(r *Report, api APIView, want Expectations) Judgement {
	var j Judgement
	if !j.accounted(r) {
		j.Mismatches = append(j.Mismatches, "etcd's read does not hold every object the API lists: nothing is proven")
		return j
	}
	unreadable := r.objectsAt(EncryptedVersion) + r.objectsAt(UnknownVersion)
	if unreadable > 0 {
		consequence := ""
		if api.CRD != nil {
			consequence = ": no version is proven safe to remove"
		}
		j.add(CannotTell, "cannot tell the version of %s (%s)%s", objects(unreadable), r.unreadableReason(), consequence)
	}
	if api.CRD != nil {
		j.judgeCRD(r, api, unreadable > 0)
	} else {
		j.judgeBuiltIn(r, api)
	}
	if r.NotUnderKey != nil {
		j.judgeKey(r, want.Key)
	}
	if want.Version != "" {
		apiVersion := want.Version
		if !strings.Contains(apiVersion, "/") && api.Group != "" {
			apiVersion = api.Group + "/" + apiVersion
		}
		for _, v := range r.VersionsSorted() {
			if v != apiVersion {
				j.Mismatches = append(j.Mismatches, fmt.Sprintf("%s stored at %s, not %s%s", objects(r.Versions[v].Objects), v, apiVersion, names(r.Versions[v])))
			}
		}
	}
	return j
}

// accounted holds etcd's count against the API's at the same revision. A
// read that found fewer keys than the API lists objects looked in the wrong
// place (another prefix, another etcd, a key layout verify does not know);
// an API that could not list the resource may no longer read what etcd
// holds.
func (j *Judgement) accounted(r *Report) bool {
	switch {
	case r.APIRevisionUnknown:
		j.add(Unaccounted, "the API could not list this resource at revision %d, the revision this read of etcd was at (%s): the API server keeps it in another etcd. Check --etcd-endpoints (a resource in the API server's --etcd-servers-overrides is kept in another etcd)",
			r.Revision, r.APIError)
		return false
	case r.APICountUnknown:
		j.add(Unaccounted, "cannot tell: the API listed this resource at revision %d without saying how many objects it holds (%s), so etcd's %d keys under %s are held against no count: nothing is proven",
			r.Revision, r.APIError, r.KeysAtRevision, r.KeyPrefix)
		return false
	case r.APIError != "":
		j.add(Danger, "the API could not list this resource at etcd's revision %d (%s), while etcd holds %s under %s: if no version the API serves can read them, they are lost to the API; serve a version they are stored at, and check that --etcd-endpoints is the etcd the API server keeps this resource in",
			r.Revision, r.APIError, objects(int(r.KeysAtRevision)), r.KeyPrefix)
		return false
	case r.APIObjects == nil:
		j.add(Unaccounted, "etcd's count under %s was held against no count of the API's: nothing is proven", r.KeyPrefix)
		return false
	case r.KeysAtRevision < *r.APIObjects:
		j.add(Unaccounted, "etcd holds %d keys under %s at revision %d, but the API lists %s at that revision: this read does not see them all. Check --etcd-prefix (the API server's --etcd-prefix), --etcd-endpoints (a resource in the API server's --etcd-servers-overrides is kept in another etcd) and that this is the etcd of this cluster",
			r.KeysAtRevision, r.KeyPrefix, r.Revision, objects(int(*r.APIObjects)))
		return false
	case !r.Snapshot:
		j.add(Unaccounted, "etcd compacted revision %d while this read went on, and the read finished at newer revisions: its counts are of no one moment, and are not held against the API's. Run verify again (with a higher --rate, or none)", r.Revision)
		return false
	case r.Objects != int(r.KeysAtRevision):
		j.add(Unaccounted, "this read counted %s under %s, but etcd held %d keys there at revision %d: run verify again", objects(r.Objects), r.KeyPrefix, r.KeysAtRevision, r.Revision)
		return false
	case r.KeysAtRevision > *r.APIObjects && !r.SharedEtcd:
		j.add(Unaccounted, "etcd holds %d keys under %s at revision %d, but the API lists %s at that revision: these keys are not all this API server's (another cluster's prefix in a shared etcd holds more). Check --etcd-prefix; if this etcd is shared and the prefix holds other keys by design, say so with --etcd-shared",
			r.KeysAtRevision, r.KeyPrefix, r.Revision, objects(int(*r.APIObjects)))
		return false
	case r.APIFirstRevision != 0 && r.APIFirstInEtcd != r.APIFirstRevision:
		j.add(Unaccounted, "the first object the API lists at revision %d, %s, was last written at revision %d, but %s: this is not the etcd, or the prefix, the API server keeps this resource in. Check --etcd-prefix and --etcd-endpoints",
			r.Revision, r.APIFirst, r.APIFirstRevision, firstInEtcd(r))
		return false
	case r.KeysAtRevision > *r.APIObjects && r.APIFirstRevision == 0:
		j.add(Unaccounted, "etcd holds %d keys under %s at revision %d, but the API lists %s: with --etcd-shared the prefix is proven by the first object the API lists, and it lists none. Check --etcd-prefix",
			r.KeysAtRevision, r.KeyPrefix, r.Revision, objects(int(*r.APIObjects)))
		return false
	case r.APIFirst != "" && r.EtcdFirst != "" && r.APIFirst != r.EtcdFirst && !r.SharedEtcd:
		j.add(Unaccounted, "the first object etcd holds under %s is %s, but the first the API lists at revision %d is %s: this is not the etcd, or the prefix, the API server keeps this resource in. Check --etcd-prefix and --etcd-endpoints",
			r.KeyPrefix, r.EtcdFirst, r.Revision, r.APIFirst)
		return false
	case r.APIObjectsNow != nil && *r.APIObjectsNow > 0:
		j.add(Unaccounted, "etcd holds no key under %s at revision %d, but the API lists %s now: this read may not see them. Check --etcd-prefix and --etcd-endpoints, and run verify again if they were created since",
			r.KeyPrefix, r.Revision, objects(int(*r.APIObjectsNow)))
		return false
	case r.KeysAtRevision > *r.APIObjects:
		j.add(CannotTell, "etcd holds %d keys under %s at revision %d, the API lists %s at that revision (--etcd-shared): the first object the API lists is under this prefix at its own revision, and the %d keys the API does not show are counted too",
			r.KeysAtRevision, r.KeyPrefix, r.Revision, objects(int(*r.APIObjects)), r.KeysAtRevision-*r.APIObjects)
	}
	return true
}

// firstInEtcd says what etcd holds at the key of the API's first object.
func firstInEtcd(r *Report) string {
	if r.APIFirstInEtcd == 0 {
		return fmt.Sprintf("etcd holds no key %s%s at that revision", r.KeyPrefix, r.APIFirst)
	}
	return fmt.Sprintf("etcd's key %s%s was last written at revision %d", r.KeyPrefix, r.APIFirst, r.APIFirstInEtcd)
}

// judgeKey holds the objects against --expect-key. A key named ambiguously
// is no match: a KMS v2 provider whose objects are under several key IDs,
// or a key ID that no object has but a key's name some do.
func (j *Judgement) judgeKey(r *Report, want KeyWant) {
	if len(r.nameOnly) > 0 && r.NotUnderKey.Objects == r.Objects {
		forms := make([]string, 0, len(r.nameOnly))
		for label, n := range r.nameOnly {
			forms = append(forms, fmt.Sprintf("%s under %s", objects(n), label))
		}
		slices.Sort(forms)
		j.Refused = fmt.Sprintf("--expect-key %s is read as a KMS v2 key ID, and no object is under that key ID, but etcd holds %s: name a key with its provider", want, strings.Join(forms, " and "))
		j.Mismatches = append(j.Mismatches, j.Refused)
	}
	if n := r.NotUnderKey.Objects; n > 0 {
		j.Mismatches = append(j.Mismatches, fmt.Sprintf("%s not stored under key %s%s", objects(n), want, names(r.NotUnderKey)))
	}
	if len(r.keyIDs) > 1 {
		ids := make([]string, 0, len(r.keyIDs))
		for id, n := range r.keyIDs {
			ids = append(ids, fmt.Sprintf("%s %d", id, n))
		}
		slices.Sort(ids)
		j.Mismatches = append(j.Mismatches, fmt.Sprintf("the objects under %s are under %d KMS v2 key IDs (%s): a rotation is not finished; give the key ID to gate on it", want, len(ids), strings.Join(ids, ", ")))
	}
}

// Unaccounted says whether the read did not hold every object the API
// lists.
func (j Judgement) Unaccounted() bool {
	return slices.ContainsFunc(j.Findings, func(f Finding) bool { return f.Severity == Unaccounted })
}

func (j *Judgement) add(s Severity, format string, args ...any) {
	j.Findings = append(j.Findings, Finding{Severity: s, Message: fmt.Sprintf(format, args...)})
}

func (j *Judgement) judgeCRD(r *Report, api APIView, unreadable bool) {
	crd := api.CRD
	storage := api.Group + "/" + crd.StorageVersion
	versions := slices.Clone(crd.Versions)
	// Versions etcd holds that the CRD no longer has.
	for _, v := range r.VersionsSorted() {
		name, ok := strings.CutPrefix(v, api.Group+"/")
		if ok && !slices.Contains(versions, name) {
			versions = append(versions, name)
		}
	}
	for _, v := range versions {
		if v == crd.StorageVersion {
			continue
		}
		stored := r.Versions[api.Group+"/"+v]
		n := 0
		if stored != nil {
			n = stored.Objects
		}
		listed := slices.Contains(crd.StoredVersions, v)
		inSpec := slices.Contains(crd.Versions, v)
		switch {
		case n > 0 && !inSpec:
			j.add(Danger, "etcd holds %s at %s, a version the CRD no longer has: the API server cannot read them; add %s back (served: false) and migrate%s", objects(n), v, v, names(stored))
		case n > 0 && !listed:
			j.add(Danger, "status.storedVersions no longer lists %s but etcd holds %s at it: put it back before removing the version%s", v, objects(n), names(stored))
		case n > 0:
			j.add(Pending, "not safe to remove %s: %s still stored at it%s", v, objects(n), names(stored))
		case unreadable:
			j.add(CannotTell, "no readable object is stored at %s, but some versions cannot be read: not proven safe to remove", v)
		case listed:
			j.add(Pending, "etcd holds no object at %s, but status.storedVersions still lists it: migrate (restow prunes it) before removing %s", v, v)
		default:
			j.add(Fine, "safe to remove %s: etcd holds no object at it and status.storedVersions does not list it", v)
		}
	}
	if c := r.Versions[storage]; c != nil {
		j.add(Fine, "%s stored at %s, the storage version", objects(c.Objects), crd.StorageVersion)
	} else if r.Objects == 0 {
		j.add(Fine, "etcd holds no object of this resource")
	}
}

func (j *Judgement) judgeBuiltIn(r *Report, api APIView) {
	if r.Objects == 0 {
		j.add(Fine, "etcd holds no object of this resource")
		return
	}
	if api.StorageVersionHash == "" {
		j.add(CannotTell, "the API server publishes no storageVersionHash for this resource: the storage version is not known")
	}
	for _, v := range r.VersionsSorted() {
		if v == EncryptedVersion || v == UnknownVersion {
			continue
		}
		c := r.Versions[v]
		group, version, ok := strings.Cut(v, "/")
		if !ok {
			group, version = "", v
		}
		switch {
		case api.StorageVersionHash == "":
			j.add(CannotTell, "%s stored at %s", objects(c.Objects), v)
		case discovery.StorageVersionHash(group, version, api.Kind) == api.StorageVersionHash:
			j.add(Fine, "%s stored at %s, the version the API server stores at", objects(c.Objects), v)
		default:
			j.add(Pending, "%s stored at %s, not the version the API server stores at now: re-store them (kubectl restow run)%s", objects(c.Objects), v, names(c))
		}
	}
}

func (r *Report) objectsAt(version string) int {
	if c := r.Versions[version]; c != nil {
		return c.Objects
	}
	return 0
}

func (r *Report) unreadableReason() string {
	var why []string
	if n := r.objectsAt(EncryptedVersion); n > 0 {
		why = append(why, fmt.Sprintf("%d encrypted", n))
	}
	for problem, n := range r.Problems {
		why = append(why, fmt.Sprintf("%d: %s", n, problem))
	}
	slices.Sort(why)
	return strings.Join(why, "; ")
}

// names lists a count's first names, for a message.
func names(c *Count) string {
	if c == nil || len(c.Names) == 0 {
		return ""
	}
	more := ""
	if c.Objects > len(c.Names) {
		more = ", …"
	}
	return " (" + strings.Join(c.Names, ", ") + more + ")"
}

// Failed says whether any finding is Danger.
func (j Judgement) Failed() bool {
	return slices.ContainsFunc(j.Findings, func(f Finding) bool { return f.Severity == Danger })
}

// objects says "1 object" or "n objects".
func objects(n int) string {
	if n == 1 {
		return "1 object"
	}
	return fmt.Sprintf("%d objects", n)
}
