package migrator_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/restow/restow/internal/migrator"
)

// TestServerHashesMoved: the trigger of built-in resources leaves a
// StorageMigration asleep only when every API server was read and each
// publishes the hash it recorded; a server that does not list the
// resource, or one that was not read, wakes it.
func TestServerHashesMoved(t *testing.T) {
	secrets := schema.GroupResource{Resource: "secrets"}
	for _, tc := range []struct {
		name  string
		sweep migrator.ServerHashes
		want  bool
	}{
		{"every server at the recorded hash", migrator.ServerHashes{Servers: 3, Hashes: map[schema.GroupResource][]string{secrets: {"a", "a", "a"}}}, false},
		{"one server upgraded", migrator.ServerHashes{Servers: 3, Hashes: map[schema.GroupResource][]string{secrets: {"a", "b", "a"}}}, true},
		{"one server does not list it", migrator.ServerHashes{Servers: 3, Hashes: map[schema.GroupResource][]string{secrets: {"a", "", "a"}}}, true},
		{"no server lists it", migrator.ServerHashes{Servers: 3, Hashes: map[schema.GroupResource][]string{}}, true},
		{"not every server read", migrator.ServerHashes{Servers: 3, Unseen: "127.0.0.2:6443 cannot be read", Hashes: map[schema.GroupResource][]string{secrets: {"a"}}}, true},
		{"nothing read (the zero value)", migrator.ServerHashes{}, true},
		{"one API server: the usual read is its", migrator.ServerHashes{Single: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.sweep.Moved(secrets, "a"); got != tc.want {
				t.Errorf("Moved = %v, want %v", got, tc.want)
			}
		})
	}
}
