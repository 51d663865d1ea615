package migrator

import (
	"errors"

	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// What proves an object stored at the target version, for the re-check after
// the settle window (finish.go): the first pass's list snapshot, and the
// resourceVersions the pass's own writes answered with. The pass records
// them (pass.go, write.go); the finish reads them.

// maxProven bounds the record of the pass's own writes within the settle
// window: past it, objects are re-checked rather than recorded, so memory
// stays bounded whatever the window's length and the pass's pace.
const maxProven = 1 << 17

// noteWindowEnd keeps the first resourceVersion read after the settle window.
func (mg *migration) noteWindowEnd(resourceVersion string) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.cp.WindowEnd == "" {
		mg.cp.WindowEnd = resourceVersion
	}
}

// noteListSnapshot keeps the resourceVersion of the first pass's list.
func (mg *migration) noteListSnapshot(resourceVersion string) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.cp.ListResourceVersion == "" {
		mg.cp.ListResourceVersion = resourceVersion
	}
}

// noteOwnWrite records the resourceVersion a rewrite answered with: at that
// version the object is stored at the target. Only versions after the list
// snapshot and at or before the end of the settle window are of use, so the
// record stops growing once the window has ended; a rewrite whose answer
// comes just after windowEnd was read is still recorded if it committed
// before.
func (mg *migration) noteOwnWrite(resourceVersion string) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if !mg.recordWrites || mg.cp.ListResourceVersion == "" {
		return
	}
	if after, err := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.ListResourceVersion); err != nil || after <= 0 {
		return
	}
	if mg.cp.WindowEnd != "" {
		if after, err := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.WindowEnd); err != nil || after > 0 {
			return
		}
	}
	if len(mg.proven) < maxProven {
		mg.proven[resourceVersion] = struct{}{}
	}
}

// mustRecheck reports whether an object listed after the settle window
// with resourceVersion may still be stored at the old version. Anything it
// cannot compare is re-checked.
func (mg *migration) mustRecheck(resourceVersion string) bool {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.cp.WindowEnd == "" || mg.cp.ListResourceVersion == "" {
		return true
	}
	sinceList, err1 := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.ListResourceVersion)
	sinceWindow, err2 := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.WindowEnd)
	switch {
	case errors.Join(err1, err2) != nil:
		return true
	case sinceList <= 0, sinceWindow > 0:
		return false
	}
	_, proven := mg.proven[resourceVersion]
	return !proven
}
