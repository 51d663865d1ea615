package preflight

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// The plan's judgement, pure: what applying a manifest over the live CRD
// needs (Judge), and the version that carries objects across a manifest
// that drops the live storage version (Bridge).

// State is what an apply of a CRD manifest needs.
type State string

// The states, in the order of their weight: a run's exit code is its
// weightiest CRD's.
const (
	// New: the cluster has no such CRD; the apply creates it.
	New State = "new"
	// OK: the apply keeps every version status.storedVersions lists.
	OK State = "ok"
	// NeedsPrepare: the apply drops stored versions and keeps the live
	// storage version: a migration to it, and a prune of
	// status.storedVersions (kubectl restow prepare), let it through.
	NeedsPrepare State = "needs prepare"
	// Blocked: the apply drops the live storage version too (a skipped
	// release, a downgrade), or the API server refuses it for another
	// reason.
	Blocked State = "blocked"
)

// Live is what the cluster says of a CRD.
type Live struct {
	Storage        string
	StoredVersions []string
	Served         []string
	// Migrated, when set, says what restow's record shows: a pass that
	// rewrote every object at the live storage version.
	Migrated string
}

// LiveOf reads a live CRD.
func LiveOf(crd *apiextensionsv1.CustomResourceDefinition) Live {
	l := Live{StoredVersions: slices.Clone(crd.Status.StoredVersions)}
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			l.Storage = v.Name
		}
		if v.Served {
			l.Served = append(l.Served, v.Name)
		}
	}
	return l
}

// Verdict is what preflight says of one CRD.
type Verdict struct {
	CRD    string `json:"crd"`
	State  State  `json:"state"`
	Reason string `json:"reason"`
	// Drops are the versions of status.storedVersions the manifest drops.
	Drops []string `json:"drops,omitempty"`
	// Storage is the live storage version.
	Storage string `json:"liveStorageVersion,omitempty"`
	// Ahead, for an apply that passes, are the versions status.storedVersions
	// lists after it besides the storage version: a later release that
	// drops one is refused until every object is migrated.
	Ahead []string `json:"aheadOfALaterRelease,omitempty"`
	// AheadNow says that prepare --ahead can migrate them before this
	// apply: it keeps the live storage version.
	AheadNow bool `json:"-"`
	// Bridge, for a manifest that drops the live storage version, is the
	// version prepare makes the live storage version and migrates to.
	Bridge string `json:"bridge,omitempty"`
	// CheckedResourceVersion is the resourceVersion of the live CRD that
	// was judged (and, for a bridge, field-checked): prepare writes
	// nothing to a CRD that changed since.
	CheckedResourceVersion string `json:"-"`
	// Unchecked says why a check that prepare needs before it writes could
	// not be made here (a conversion webhook out of reach): preflight
	// warns, prepare changes nothing.
	Unchecked string `json:"unchecked,omitempty"`
	// Warnings are what the user should know that does not change the
	// state.
	Warnings []string `json:"warnings,omitempty"`
	// DryRun says what the API server answered a server-side dry run of
	// the manifest: "accepted", "refused: ...", or "" when none was made.
	DryRun string `json:"dryRun,omitempty"`
	// Etcd is what etcd holds of the resource, when preflight read it.
	Etcd   *Stored `json:"etcd,omitempty"`
	Source string  `json:"source"`
}

// Stored is what a read of etcd found: how many objects are stored at each
// version, at one revision, held against the API's count there.
type Stored struct {
	Revision int64          `json:"revision"`
	Versions map[string]int `json:"versions"`
}

// String says it in a line: "20 objects at v1alpha1, 3 at v1 (etcd
// revision 812)".
func (s Stored) String() string {
	if len(s.Versions) == 0 {
		return fmt.Sprintf("no object (etcd revision %d)", s.Revision)
	}
	versions := slices.Sorted(maps.Keys(s.Versions))
	parts := make([]string, 0, len(versions))
	for i, v := range versions {
		unit := ""
		if i == 0 {
			unit = " objects"
		}
		parts = append(parts, fmt.Sprintf("%d%s at %s", s.Versions[v], unit, v))
	}
	return fmt.Sprintf("%s (etcd revision %d)", strings.Join(parts, ", "), s.Revision)
}

// Judge says what applying m needs, given the live CRD (nil when the
// cluster has none).
func Judge(m Manifest, live *Live) Verdict {
	v := Verdict{CRD: m.Name, Source: m.Source}
	if live == nil {
		v.State, v.Reason = New, "no such CRD in the cluster: the apply creates it"
		return v
	}
	v.Storage = live.Storage
	for _, stored := range live.StoredVersions {
		if !slices.Contains(m.Versions, stored) {
			v.Drops = append(v.Drops, stored)
		}
	}
	switch {
	case len(v.Drops) == 0:
		v.State, v.Reason = OK, fmt.Sprintf("the manifest keeps every version status.storedVersions lists (%s)", strings.Join(live.StoredVersions, ", "))
		foresee(&v, m, *live)
	case slices.Contains(m.Versions, live.Storage):
		v.State = NeedsPrepare
		v.Reason = fmt.Sprintf("the manifest drops %s, which status.storedVersions still lists: kubectl restow prepare migrates every object to %s, the live storage version, and prunes status.storedVersions to [%s]; the apply then passes",
			strings.Join(v.Drops, ", "), live.Storage, live.Storage)
		if live.Migrated != "" {
			v.Reason += "; " + live.Migrated
		}
	default:
		c, unserved, ok := Bridge(m, *live)
		if !ok {
			v.State = Blocked
			v.Reason = fmt.Sprintf("the manifest drops %s, the live storage version, as a skipped release or a downgrade does (status.storedVersions lists %s), and no version the live CRD serves is in the manifest to carry the objects across: the API server refuses the apply. Apply a release in between that lists a version both sides know, first",
				live.Storage, strings.Join(live.StoredVersions, ", "))
			return v
		}
		if m.CRD == nil {
			// --keep names versions, not schemas: what the release's
			// schema of the bridge keeps of each object is not known.
			v.State = Blocked
			v.Reason = fmt.Sprintf("the release drops %s, the live storage version, as a skipped release or a downgrade does (status.storedVersions lists %s), and --keep gives the versions the release keeps, not its schemas: restow cannot check that objects carried across at %s keep every field the release's schema of %s allows, so it bridges nothing. Nothing was changed. Give the release's CRD with -f instead",
				live.Storage, strings.Join(live.StoredVersions, ", "), c, c)
			return v
		}
		v.State, v.Bridge = NeedsPrepare, c
		v.Reason = fmt.Sprintf("the manifest drops %s, the live storage version, as a skipped release or a downgrade does (status.storedVersions lists %s): kubectl restow prepare makes %s (served by both) the live storage version, once no field of any object would be lost at it, migrates every object to it and prunes status.storedVersions to [%s]; the apply then passes",
			live.Storage, strings.Join(live.StoredVersions, ", "), c, c)
		if unserved {
			v.Warnings = append(v.Warnings, fmt.Sprintf("the manifest lists %s with served: false: the new release's conversion must still read objects stored at it", c))
		}
	}
	return v
}

// foresee records on v, for a manifest whose apply passes, the versions
// status.storedVersions lists after the apply besides the storage version,
// and warns that a later release that drops one is refused.
func foresee(v *Verdict, m Manifest, live Live) {
	storage := m.Storage
	if storage == "" {
		// --keep: the release's storage version is not known; the live
		// one is the best guess, and prepare --ahead migrates to it.
		storage = live.Storage
	}
	for _, stored := range appendNew(slices.Clone(live.StoredVersions), live.Storage) {
		if stored != storage {
			v.Ahead = append(v.Ahead, stored)
		}
	}
	if len(v.Ahead) == 0 {
		return
	}
	v.AheadNow = storage == live.Storage
	how := fmt.Sprintf("kubectl restow run %s after the apply", m.Name)
	if v.AheadNow {
		how = "kubectl restow prepare --ahead now, or " + how
	}
	v.Warnings = append(v.Warnings, fmt.Sprintf("after the apply status.storedVersions still lists %s besides the storage version %s: a later release that drops %s is refused until every object is migrated to %s. The restow operator does it by itself; without it, %s",
		strings.Join(v.Ahead, ", "), storage, strings.Join(v.Ahead, ", "), storage, how))
}

// Bridge chooses the version that carries the objects across a manifest
// that drops the live storage version (a skipped release, a downgrade):
// one the live CRD serves (discovery shows no hash for an unserved
// version, and the proof for several API servers needs it) and the
// manifest lists. It prefers the manifest's storage version, then the
// versions the manifest serves, in its order, then those it lists with
// served: false; for the last, unserved says so (the new release's
// conversion must still read it). ok is false when there is none.
func Bridge(m Manifest, live Live) (version string, unserved bool, ok bool) {
	servedLive := func(v string) bool { return slices.Contains(live.Served, v) }
	if m.Storage != "" && servedLive(m.Storage) {
		return m.Storage, false, true
	}
	for _, v := range m.Versions {
		if servedLive(v) && (m.Served == nil || slices.Contains(m.Served, v)) {
			return v, false, true
		}
	}
	for _, v := range m.Versions {
		if servedLive(v) {
			return v, true, true
		}
	}
	return "", false, false
}

// Weight orders states for the exit code: the weightiest CRD decides.
func (s State) Weight() int {
	switch s {
	case Blocked:
		return 2
	case NeedsPrepare:
		return 1
	}
	return 0
}
