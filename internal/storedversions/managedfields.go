package storedversions

import (
	"bytes"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// RepointManagedFields returns an object's managedFields with every entry
// that names a version of group no longer served re-pointed at the storage
// version, and whether anything changed.
//
// Server-side apply converts each entry to the version it names; once that
// version is removed from the CRD, every apply to the object fails ("request
// to convert CR to an invalid group/version"). Removing those entries instead
// would make the next apply of each manager conflict with the
// "before-first-apply" owner of its own fields; re-pointing keeps every
// manager's ownership. Where the versions share a schema the field paths are
// exact; where a field was renamed, its old path owns nothing and the new
// one is unowned until a manager applies it, which conflicts with no one.
// Entries that collide once re-pointed (same manager, operation and
// subresource) are merged into one owning the union of their fields.
func RepointManagedFields(entries []metav1.ManagedFieldsEntry, group string, served []string, storage string) ([]metav1.ManagedFieldsEntry, bool, error) {
	storageAPIVersion := group + "/" + storage
	stale := func(e metav1.ManagedFieldsEntry) bool {
		for _, v := range served {
			if e.APIVersion == group+"/"+v {
				return false
			}
		}
		return true
	}
	if !slices.ContainsFunc(entries, stale) {
		return entries, false, nil
	}
	out := make([]metav1.ManagedFieldsEntry, 0, len(entries))
	for _, e := range entries {
		if stale(e) {
			e.APIVersion = storageAPIVersion
		}
		i := slices.IndexFunc(out, func(o metav1.ManagedFieldsEntry) bool {
			return o.Manager == e.Manager && o.Operation == e.Operation && o.Subresource == e.Subresource && o.APIVersion == e.APIVersion
		})
		if i < 0 {
			out = append(out, e)
			continue
		}
		merged, err := mergeEntries(out[i], e)
		if err != nil {
			return nil, false, err
		}
		out[i] = merged
	}
	return out, true, nil
}

// mergeEntries unions the fields of two entries of one manager, keeping the
// later time.
func mergeEntries(a, b metav1.ManagedFieldsEntry) (metav1.ManagedFieldsEntry, error) {
	union := &fieldpath.Set{}
	for _, e := range []metav1.ManagedFieldsEntry{a, b} {
		if e.FieldsV1 == nil {
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(bytes.NewReader(e.FieldsV1.GetRawBytes())); err != nil {
			return a, fmt.Errorf("reading managedFields of %s: %w", e.Manager, err)
		}
		union = union.Union(set)
	}
	raw, err := union.ToJSON()
	if err != nil {
		return a, err
	}
	if b.Time != nil && (a.Time == nil || a.Time.Before(b.Time)) {
		a.Time = b.Time
	}
	a.FieldsType, a.FieldsV1 = "FieldsV1", metav1.NewFieldsV1(string(raw))
	return a, nil
}
