package migrator

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HeldBodyBytes is what m's passes hold of listed objects now.
func HeldBodyBytes(m *Migrator) int64 { return m.bodyBytes.Load() }

// Lookup reads obj's metadata as a pass of a migration of target would
// before it gives up on a write.
func Lookup(ctx context.Context, m *Migrator, target Target, obj *metav1.PartialObjectMetadata) (*metav1.PartialObjectMetadata, error) {
	return newMigration(m, target, Options{}, func(Progress) {}).lookup(ctx, obj)
}
