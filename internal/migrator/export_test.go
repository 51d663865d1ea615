package migrator

// HeldBodyBytes is what m's passes hold of listed objects now.
func HeldBodyBytes(m *Migrator) int64 { return m.bodyBytes.Load() }
