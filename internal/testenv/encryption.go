package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// aescbcKeys are fixed test keys of 32 bytes each, base64: each name keeps
// its key, so that what one configuration wrote another reads.
var aescbcKeys = map[string]string{
	"key1": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
	"key2": "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=",
}

// WriteAESCBCConfig writes an EncryptionConfiguration that encrypts Secrets
// with aescbc under keys (key1, key2) in order: the first writes, all read,
// and identity reads what was never encrypted.
func WriteAESCBCConfig(tb testing.TB, path string, keys ...string) {
	tb.Helper()
	var b strings.Builder
	b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n")
	for _, k := range keys {
		secret, ok := aescbcKeys[k]
		if !ok {
			tb.Fatalf("no test key %q", k)
		}
		fmt.Fprintf(&b, "      - name: %s\n        secret: %s\n", k, secret)
	}
	b.WriteString("  - identity: {}\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
}
