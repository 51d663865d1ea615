package storedversions

import (
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// SwitchEvidence is what a CRD's own record says of its last storage
// switch: a time at or after it, by the clock of the API server that wrote
// it.
type SwitchEvidence struct {
	// At is at or after the last write that changed a storage flag of
	// spec.versions.
	At time.Time
	// Source says where At comes from, for status and logs.
	Source string
}

// LastStorageSwitch reads, from crd's managedFields, a time at or after the
// last change of a storage flag in spec.versions: the newest time of the
// field managers that own one, or own spec.versions whole (an atomic list,
// as the API server records it today, so that any write of the list
// counts). The API server stamps a manager's entry
// with its own clock whenever a write of that manager changes a field it
// owns or takes one over (an update that moves a storage flag is stamped
// as it commits; an apply always is), so the manager that moved the flags
// last carries a time at or after the move, and a manager that took a flag
// over since carries a later one. A create is stamped the same way,
// whatever managedFields it sends: every field is new to it. An update
// that changes timestamps alone is reverted by the API server, so a time
// can be set back only along with a change of some field, by a manager
// that then owns that field at the time of the write.
//
// ok is false, and nothing is known, when an entry that owns a storage
// flag has no time, or when the storage version's flag is owned by no
// entry (managedFields cleared, or never recorded): a switch may then be
// as recent as now. A client that writes managedFields itself can set any
// time; docs/architecture.md says what that leaves.
func LastStorageSwitch(crd *apiextensionsv1.CustomResourceDefinition) (SwitchEvidence, bool) {
	storage := StorageVersion(crd)
	var ev SwitchEvidence
	storageOwned := false
	for _, e := range crd.ManagedFields {
		if e.Subresource != "" || e.FieldsV1 == nil {
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(e.FieldsV1.GetRawReader()); err != nil {
			return SwitchEvidence{}, false
		}
		owned := storageFlags(set, versionNames(crd))
		if len(owned) == 0 {
			continue
		}
		if e.Time == nil {
			return SwitchEvidence{}, false
		}
		for _, v := range owned {
			storageOwned = storageOwned || v == storage
		}
		if e.Time.After(ev.At) {
			ev = SwitchEvidence{At: e.Time.Time, Source: fmt.Sprintf("field manager %s (%s), which owns storage flags of spec.versions, last wrote at %s", e.Manager, e.Operation, e.Time.UTC().Format(time.RFC3339))}
		}
	}
	if !storageOwned {
		return SwitchEvidence{}, false
	}
	return ev, true
}

// storageFlags are the versions whose spec.versions[].storage set owns.
// spec.versions is an atomic list: an owner of the list owns every flag
// in it.
func storageFlags(set *fieldpath.Set, all []string) []string {
	if set.Has(fieldpath.MakePathOrDie("spec", "versions")) {
		return all
	}
	var versions []string
	set.Iterate(func(p fieldpath.Path) {
		if len(p) != 4 || p[0].FieldName == nil || *p[0].FieldName != "spec" || p[1].FieldName == nil || *p[1].FieldName != "versions" ||
			p[2].Key == nil || p[3].FieldName == nil || *p[3].FieldName != "storage" {
			return
		}
		for _, f := range *p[2].Key {
			if f.Name == "name" && f.Value.IsString() {
				versions = append(versions, f.Value.AsString())
			}
		}
	})
	return versions
}

func versionNames(crd *apiextensionsv1.CustomResourceDefinition) []string {
	names := make([]string, 0, len(crd.Spec.Versions))
	for _, v := range crd.Spec.Versions {
		names = append(names, v.Name)
	}
	return names
}
