// Package verify reads what etcd holds for a resource, read-only, and says
// at which API version and under which encryption key each object is
// stored: the proof behind `kubectl restow verify`. It reads each value's
// own header (the JSON or CBOR apiVersion, the `k8s\0` protobuf envelope,
// the `k8s:enc:` prefix of an encrypted value and the KMS v2 envelope's key
// ID) and keeps counts and a few names, never a value.
package verify

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/fxamacker/cbor/v2"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/runtime"
	kmsapi "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"
	kjson "sigs.k8s.io/json"
)

// Encoding is how a stored value is written, as its first bytes say.
type Encoding string

// The encodings a stored value can have.
const (
	// JSON: custom resources, and any resource of an API server told to
	// store JSON.
	JSON Encoding = "json"
	// Protobuf: the `k8s\0` envelope the API server writes for built-in
	// types.
	Protobuf Encoding = "protobuf"
	// CBOR: the self-described CBOR of API servers with the
	// CBORServingAndStorage feature.
	CBOR Encoding = "cbor"
	// Encrypted: a `k8s:enc:` prefix; the version is not readable without
	// the key.
	Encrypted Encoding = "encrypted"
	// Unknown: none of the above, or a header that does not decode.
	Unknown Encoding = "unknown"
)

// Identity is the provider of values that are not encrypted.
const Identity = "identity"

// Stored is what the header of one stored value says. It holds no part of
// the value's contents.
type Stored struct {
	Encoding Encoding
	// APIVersion and Kind are the version the object is encoded at, when
	// the value is not encrypted and its header decodes.
	APIVersion, Kind string
	// Provider is the encryption provider (aescbc, aesgcm, secretbox, kms
	// for KMS v1, kmsv2), or Identity.
	Provider string
	// Key is the key's name in the encryption configuration (aescbc,
	// aesgcm, secretbox) or the KMS provider's name.
	Key string
	// KeyID is the KMS v2 plugin's key ID, from the envelope (which is not
	// encrypted).
	KeyID string
	// Problem says why a value could not be classified.
	Problem string
}

// KeyLabel names the key a value is stored under: "identity",
// "aescbc:key1", "kmsv2:plugin (key ID k2)".
func (s Stored) KeyLabel() string {
	switch {
	case s.Provider == "" || s.Provider == Identity:
		return Identity
	case s.KeyID != "":
		return s.Provider + ":" + s.Key + " (key ID " + s.KeyID + ")"
	default:
		return s.Provider + ":" + s.Key
	}
}

var (
	protobufMagic = []byte("k8s\x00")
	// cborSelfDescribed is the tag (55799) the API server puts before every
	// CBOR object it encodes.
	cborSelfDescribed = []byte{0xd9, 0xd9, 0xf7}
	encryptedMagic    = []byte("k8s:enc:")
)

// cborTypeMeta decodes the type fields of the API server's CBOR, which writes
// strings, map keys included, as byte strings.
var cborTypeMeta = func() cbor.DecMode {
	mode, err := cbor.DecOptions{
		ByteStringToString:  cbor.ByteStringToStringAllowed,
		FieldNameByteString: cbor.FieldNameByteStringAllowed,
		// Case-sensitive, as the API server's CBOR decoder: a root field
		// "apiversion" is not the object's apiVersion.
		FieldNameMatching: cbor.FieldNameMatchingCaseSensitive,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return mode
}()

// Classify reads the header of one value stored at key. It decodes only what
// says the version (the type fields) or the key (the prefix, and the KMS v2
// envelope's key ID), and returns nothing of the contents.
func Classify(value []byte) Stored {
	switch {
	case bytes.HasPrefix(value, encryptedMagic):
		return classifyEncrypted(value)
	case bytes.HasPrefix(value, protobufMagic):
		var envelope runtime.Unknown
		if err := envelope.Unmarshal(value[len(protobufMagic):]); err != nil {
			return Stored{Encoding: Unknown, Provider: Identity, Problem: "protobuf envelope does not decode"}
		}
		return typed(Protobuf, envelope.APIVersion, envelope.Kind)
	case bytes.HasPrefix(value, cborSelfDescribed):
		var meta struct {
			APIVersion string `cbor:"apiVersion"`
			Kind       string `cbor:"kind"`
		}
		// The decoder skips every field but these two without keeping it.
		if err := cborTypeMeta.Unmarshal(value, &meta); err != nil {
			return Stored{Encoding: Unknown, Provider: Identity, Problem: "CBOR does not decode"}
		}
		return typed(CBOR, meta.APIVersion, meta.Kind)
	case bytes.HasPrefix(bytes.TrimLeft(value, " \t\r\n"), []byte("{")):
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		// Case-sensitive, as the API server decodes: a root field
		// "apiversion" or "Kind" (kept wherever a schema preserves unknown
		// fields) is not the object's type.
		if err := kjson.UnmarshalCaseSensitivePreserveInts(value, &meta); err != nil {
			return Stored{Encoding: Unknown, Provider: Identity, Problem: "JSON does not decode"}
		}
		return typed(JSON, meta.APIVersion, meta.Kind)
	default:
		return Stored{Encoding: Unknown, Provider: Identity, Problem: "neither JSON, protobuf, CBOR nor a k8s:enc: prefix"}
	}
}

func typed(e Encoding, apiVersion, kind string) Stored {
	if apiVersion == "" {
		return Stored{Encoding: Unknown, Provider: Identity, Problem: string(e) + " without an apiVersion"}
	}
	return Stored{Encoding: e, APIVersion: apiVersion, Kind: kind, Provider: Identity}
}

// classifyEncrypted reads `k8s:enc:<provider>:<v1|v2>:<name>:` and, for KMS
// v2, the envelope's key ID. The API server writes the key's name between
// colons and the cipher's bytes after it, so a name that itself holds a
// colon ("2026:a") is cut at it: Key and KeyLabel show "2026". KeyWant
// compares the whole prefix, so "aescbc:2026:a" matches; "aescbc:2026" would
// match such a value too, and nothing in the value tells the two apart.
func classifyEncrypted(value []byte) Stored {
	rest := value[len(encryptedMagic):]
	fields := bytes.SplitN(rest, []byte(":"), 4)
	if len(fields) < 4 {
		return Stored{Encoding: Unknown, Problem: "k8s:enc: prefix without provider, version and key"}
	}
	provider, version, name := string(fields[0]), string(fields[1]), string(fields[2])
	s := Stored{Encoding: Encrypted, Provider: provider, Key: name}
	switch {
	case provider == "kms" && version == "v2":
		s.Provider = "kmsv2"
		var envelope kmsapi.EncryptedObject
		if err := proto.Unmarshal(fields[3], &envelope); err != nil || envelope.KeyID == "" {
			s.Encoding, s.Problem = Unknown, "KMS v2 envelope without a key ID"
			return s
		}
		s.KeyID = envelope.KeyID
	case version != "v1":
		s.Encoding, s.Problem = Unknown, "encryption prefix of unknown version "+version
	}
	return s
}

// Provider names as KeyLabel writes them.
const (
	// KMSv2 is a KMS v2 provider; its values carry a key ID.
	KMSv2 = "kmsv2"
)

// providers are the provider names KeyLabel writes before a key's name.
var providers = map[string]bool{"aescbc": true, "aesgcm": true, "secretbox": true, "kms": true, KMSv2: true}

// KeyWant is the key every object should be stored under (--expect-key):
// Identity (not encrypted), a provider and a key's name in the encryption
// configuration (for a KMS provider, its name), or a KMS v2 key ID.
type KeyWant struct {
	Identity       bool
	Provider, Name string
	KeyID          string
	// Given is what the user wrote.
	Given string
}

func (k KeyWant) empty() bool { return k.Given == "" }

// String is what the user wrote.
func (k KeyWant) String() string { return k.Given }

// ParseKey reads --expect-key: "identity", "<provider>:<name>" with a
// provider of KeyLabel's (aescbc:key2, kmsv2:my-plugin), or else a KMS v2 key
// ID. A key's name alone is not a KeyWant: the same name can stand under
// several providers, and Judge refuses it when it finds one so named.
func ParseKey(s string) (KeyWant, error) {
	switch provider, name, qualified := strings.Cut(s, ":"); {
	case s == "":
		return KeyWant{}, nil
	case s == Identity:
		return KeyWant{Identity: true, Given: s}, nil
	case qualified && providers[provider]:
		if name == "" {
			return KeyWant{}, fmt.Errorf("--expect-key %q names a provider without a key name", s)
		}
		return KeyWant{Provider: provider, Name: name, Given: s}, nil
	case strings.TrimSpace(s) != s:
		return KeyWant{}, fmt.Errorf("--expect-key %q has spaces around it", s)
	default:
		return KeyWant{KeyID: s, Given: s}, nil
	}
}

// matches says whether a value classified as s is stored under the key.
func (k KeyWant) matches(s Stored, value []byte) bool {
	switch {
	case k.Identity:
		return s.Provider == Identity
	case s.Encoding != Encrypted:
		return false
	case k.KeyID != "":
		return s.KeyID == k.KeyID
	case k.Provider != s.Provider:
		return false
	}
	// The whole prefix, so that a name holding a colon matches too.
	version, stored := "v1", s.Provider
	if s.Provider == KMSv2 {
		stored, version = "kms", "v2"
	}
	return bytes.HasPrefix(value, []byte("k8s:enc:"+stored+":"+version+":"+k.Name+":"))
}
