package migrator_test

import (
	"testing"
	"time"

	"github.com/restow/restow/internal/migrator"
)

// TestWindowIgnoresManagedFieldsDates: a CRD records no switch time restow
// can trust. Its managedFields can date the last write of spec.versions
// before the switch (kubectl's move from client-side to server-side apply
// leaves exactly that; docs/architecture.md), so a storage switch whose
// managedFields look ten minutes old still gets its whole settle window,
// counted from the migration's own start.
func TestWindowIgnoresManagedFieldsDates(t *testing.T) {
	const window = 4 * time.Second
	fx := switched(t, "dated.migrator.restow.dev", 50)
	if err := env.AgeStorageSwitch(t.Context(), fx.CRDName(), 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	m, _ := newMigrator(t)
	target := resolve(t, m, fx)
	began := time.Now()
	result, err := m.Migrate(t.Context(), target, migrator.Options{Prune: true, SettleWindow: window}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < window || !result.Settled {
		t.Errorf("the migration took %s (settled: %v), want the whole settle window (%s) from its start", took, result.Settled, window)
	}
	fx.AssertAllStoredAt(t, "v1", 50)
	fx.AssertStoredVersions(t, "v1")
}
