package supplychain_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/restow/restow/internal/krew"
)

// TestSignBlobBundleVerifiesOnlyTheSignedFile signs release assets as the
// release workflow does, cosign sign-blob --bundle, with a throw-away key
// instead of the workflow's OIDC identity and without the transparency log
// (neither can be had offline), and verifies them as docs/install.md tells
// users to, cosign verify-blob --bundle. The bundle must be the Sigstore
// bundle users download beside each asset, signing the asset's sha256;
// verification must refuse a changed asset and another key.
func TestSignBlobBundleVerifiesOnlyTheSignedFile(t *testing.T) {
	cosign := tool(t, "COSIGN")
	dir := t.TempDir()
	// Nothing of the user's: cosign keeps its state under HOME and TUF_ROOT.
	env := []string{"HOME=" + dir, "TUF_ROOT=" + filepath.Join(dir, "tuf"), "COSIGN_PASSWORD="}
	run := func(args ...string) (string, error) {
		t.Helper()
		return command(t, dir, env, cosign, args...)
	}

	// Assets as make dist writes them: a plugin archive and checksums.txt.
	license := filepath.Join(dir, "src", "LICENSE")
	binary := filepath.Join(dir, "src", "kubectl-restow")
	writeFile(t, license, "Apache License 2.0\n")
	writeFile(t, binary, "a kubectl-restow binary\n")
	archives, err := krew.PackPlatforms(dir, "v1.2.3", license, map[krew.OSArch]string{{OS: "linux", Arch: "amd64"}: binary})
	if err != nil {
		t.Fatal(err)
	}
	checksums := filepath.Join(dir, "checksums.txt")
	if err := krew.WriteChecksumsFile(checksums, archives); err != nil {
		t.Fatal(err)
	}
	assets := slices.Concat(archives, []string{checksums})

	if out, err := run("generate-key-pair"); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
	}
	for _, asset := range assets {
		bundle := asset + ".sigstore.json"
		if out, err := run("sign-blob", "--yes", "--key", "cosign.key",
			"--use-signing-config=false", "--tlog-upload=false", "--bundle", bundle, asset); err != nil {
			t.Fatalf("cosign sign-blob %s: %v\n%s", filepath.Base(asset), err, out)
		}
		checkBundle(t, bundle, asset)
		if out, err := run("verify-blob", "--key", "cosign.pub", "--insecure-ignore-tlog", "--bundle", bundle, asset); err != nil {
			t.Errorf("cosign verify-blob %s: %v\n%s", filepath.Base(asset), err, out)
		}
	}

	archive := archives[0]
	bundle := archive + ".sigstore.json"
	changed := filepath.Join(dir, "changed", filepath.Base(archive))
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, changed, string(append(data, 0)))
	if out, err := run("verify-blob", "--key", "cosign.pub", "--insecure-ignore-tlog", "--bundle", bundle, changed); err == nil {
		t.Errorf("cosign verify-blob accepted a changed archive with the original's bundle:\n%s", out)
	}

	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := command(t, other, env, cosign, "generate-key-pair"); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
	}
	if out, err := run("verify-blob", "--key", filepath.Join(other, "cosign.pub"), "--insecure-ignore-tlog", "--bundle", bundle, archive); err == nil {
		t.Errorf("cosign verify-blob accepted the archive with another key:\n%s", out)
	}
}

// checkBundle reads a bundle as Sigstore's bundle format defines it: a
// v0.3 bundle whose message signature is over the asset's sha256.
func checkBundle(t *testing.T, bundle, asset string) {
	t.Helper()
	raw, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	var b struct {
		MediaType        string `json:"mediaType"`
		MessageSignature struct {
			MessageDigest struct {
				Algorithm string `json:"algorithm"`
				Digest    string `json:"digest"`
			} `json:"messageDigest"`
			Signature string `json:"signature"`
		} `json:"messageSignature"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("%s: %v", bundle, err)
	}
	if want := "application/vnd.dev.sigstore.bundle.v0.3+json"; b.MediaType != want {
		t.Errorf("%s: mediaType %q, want %q", filepath.Base(bundle), b.MediaType, want)
	}
	data, err := os.ReadFile(asset)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	d := b.MessageSignature.MessageDigest
	if d.Algorithm != "SHA2_256" || d.Digest != base64.StdEncoding.EncodeToString(sum[:]) {
		t.Errorf("%s: signs %s %s, want SHA2_256 of %s", filepath.Base(bundle), d.Algorithm, d.Digest, filepath.Base(asset))
	}
	if b.MessageSignature.Signature == "" {
		t.Errorf("%s: no signature", filepath.Base(bundle))
	}
}

func writeFile(t *testing.T, file, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
