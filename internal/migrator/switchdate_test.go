package migrator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// TestSettleWindowFromTheSwitch: the settle window counts from the last
// storage switch where the CRD's managedFields date it. A switch a release
// old (dated back ten minutes) needs no wait even with the default
// window; a switch just made is waited out in full, and so is an old one
// whose managedFields were cleared, since nothing dates it then.
func TestSettleWindowFromTheSwitch(t *testing.T) {
	t.Run("a switch a release old", func(t *testing.T) {
		fx := switched(t, "old-switch.migrator.restow.dev", 50)
		if err := env.AgeStorageSwitch(t.Context(), fx.CRDName(), 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		m, _ := newMigrator(t)
		began := time.Now()
		result := migrateWith(t, m, fx, 0)
		if took := time.Since(began); took >= migrator.DefaultSettleWindow {
			t.Errorf("the migration of a switch ten minutes old took %s, want no settle window (%s)", took, migrator.DefaultSettleWindow)
		}
		if !strings.Contains(result.SettleFrom, "field manager") {
			t.Errorf("SettleFrom = %q, want the field manager whose managedFields dated the switch", result.SettleFrom)
		}
		fx.AssertAllStoredAt(t, "v1", 50)
		fx.AssertStoredVersions(t, "v1")
	})
	const window = 4 * time.Second
	t.Run("a switch just made", func(t *testing.T) {
		before := time.Now()
		fx := switched(t, "new-switch.migrator.restow.dev", 50)
		m, _ := newMigrator(t)
		migrateWith(t, m, fx, window)
		if ended := time.Now(); ended.Before(before.Add(window)) {
			t.Errorf("the migration ended %s after the switch began, within the settle window (%s)", ended.Sub(before), window)
		}
		fx.AssertAllStoredAt(t, "v1", 50)
	})
	t.Run("an old switch whose managedFields were cleared", func(t *testing.T) {
		fx := switched(t, "cleared.migrator.restow.dev", 50)
		if err := env.AgeStorageSwitch(t.Context(), fx.CRDName(), 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := env.ClearManagedFields(t.Context(), fx.CRDName()); err != nil {
			t.Fatal(err)
		}
		m, _ := newMigrator(t)
		began := time.Now()
		result := migrateWith(t, m, fx, window)
		if took := time.Since(began); took < window || result.SettleFrom != "" {
			t.Errorf("took %s, settle window counted from %q; want the whole window (%s) from the migration's start", took, result.SettleFrom, window)
		}
		fx.AssertAllStoredAt(t, "v1", 50)
	})
}

// migrateWith resolves fx and migrates it with pruning and window (0: the
// default), and wants it settled.
func migrateWith(t *testing.T, m *migrator.Migrator, fx testenv.Fixture, window time.Duration) migrator.Result {
	t.Helper()
	result, err := m.Migrate(t.Context(), resolve(t, m, fx), migrator.Options{Prune: true, SettleWindow: window}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !result.Settled || result.Failed > 0 {
		t.Fatalf("result = %+v, want settled with nothing failed", result)
	}
	return result
}
