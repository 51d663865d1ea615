package verify

import (
	"bytes"
	"context"
	"crypto/aes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apiserver/pkg/storage/value"
	aestransformer "k8s.io/apiserver/pkg/storage/value/encrypt/aes"
	kmsapi "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"
	"k8s.io/client-go/kubernetes/scheme"
)

// planted is a value no classification may carry.
const planted = "planted-secret-value-4f1c"

func plantedSecret() *corev1.Secret {
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"},
		Data:       map[string][]byte{"password": []byte(planted)},
	}
}

func plantedWidget() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1beta1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "namespace": "ns"},
		"spec":     map[string]any{"secret": planted},
	}}
}

// encode writes obj as the API server's serializer for it does.
func encode(t *testing.T, s runtime.Encoder, obj runtime.Object) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := s.Encode(obj, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// aescbc encrypts plain as kube-apiserver's aescbc provider does for key
// name.
func aescbc(t *testing.T, name string, plain []byte) []byte {
	t.Helper()
	block, err := aes.NewCipher(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	cbc := aestransformer.NewCBCTransformer(block)
	prefixed := value.NewPrefixTransformers(nil, value.PrefixTransformer{Prefix: []byte("k8s:enc:aescbc:v1:" + name + ":"), Transformer: cbc})
	out, err := prefixed.TransformToStorage(context.Background(), plain, value.DefaultContext(nil))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kmsv2 wraps plain as a KMS v2 envelope with keyID would, the data itself
// left as it is (the envelope, not the cipher, is what verify reads).
func kmsv2(t *testing.T, provider, keyID string, plain []byte) []byte {
	t.Helper()
	envelope, err := proto.Marshal(&kmsapi.EncryptedObject{EncryptedData: plain, KeyID: keyID, EncryptedDEKSource: []byte("dek")})
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte("k8s:enc:kms:v2:"+provider+":"), envelope...)
}

func TestClassify(t *testing.T) {
	widgetJSON, err := json.Marshal(plantedWidget().Object)
	if err != nil {
		t.Fatal(err)
	}
	secretProto := encode(t, protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), plantedSecret())
	widgetCBOR := encode(t, cbor.NewSerializer(scheme.Scheme, scheme.Scheme), plantedWidget())
	for _, tc := range []struct {
		name  string
		value []byte
		want  Stored
		// keys the value matches, and one it does not.
		matches []string
		not     string
	}{
		{
			name: "custom resource as JSON", value: widgetJSON,
			want:    Stored{Encoding: JSON, APIVersion: "example.com/v1beta1", Kind: "Widget", Provider: Identity},
			matches: []string{"identity"}, not: "aescbc:key1",
		},
		{
			name: "built-in as protobuf", value: secretProto,
			want:    Stored{Encoding: Protobuf, APIVersion: "v1", Kind: "Secret", Provider: Identity},
			matches: []string{"identity"}, not: "aescbc:key1",
		},
		{
			name: "custom resource as CBOR", value: widgetCBOR,
			want:    Stored{Encoding: CBOR, APIVersion: "example.com/v1beta1", Kind: "Widget", Provider: Identity},
			matches: []string{"identity"}, not: "aescbc:key1",
		},
		{
			name: "aescbc", value: aescbc(t, "key1", secretProto),
			want:    Stored{Encoding: Encrypted, Provider: "aescbc", Key: "key1"},
			matches: []string{"aescbc:key1"}, not: "aesgcm:key1",
		},
		{
			name: "aescbc key whose name holds a colon", value: aescbc(t, "2026:a", secretProto),
			want: Stored{Encoding: Encrypted, Provider: "aescbc", Key: "2026"},
			// Told apart from a key named 2026 only by the bytes that
			// follow, which are the cipher's: not at all.
			matches: []string{"aescbc:2026:a"}, not: "aescbc:key1",
		},
		{
			name: "KMS v2", value: kmsv2(t, "plugin", "key-id-2", secretProto),
			want:    Stored{Encoding: Encrypted, Provider: "kmsv2", Key: "plugin", KeyID: "key-id-2"},
			matches: []string{"kmsv2:plugin", "key-id-2"}, not: "key-id-1",
		},
		{
			// A bare name is read as a key ID: the provider's name is not one.
			name: "KMS v2, its provider's name alone", value: kmsv2(t, "plugin", "key-id-2", secretProto),
			want: Stored{Encoding: Encrypted, Provider: "kmsv2", Key: "plugin", KeyID: "key-id-2"},
			not:  "plugin",
		},
		{
			name: "KMS v2 envelope that does not decode", value: []byte("k8s:enc:kms:v2:plugin:\xff\xff"),
			want: Stored{Encoding: Unknown, Provider: "kmsv2", Key: "plugin", Problem: "KMS v2 envelope without a key ID"},
			not:  "identity",
		},
		{
			name: "JSON without apiVersion", value: []byte(`{"kind":"Widget"}`),
			want: Stored{Encoding: Unknown, Provider: Identity, Problem: "json without an apiVersion"},
		},
		{
			name: "neither", value: []byte("\x00\x01garbage " + planted),
			want: Stored{Encoding: Unknown, Provider: Identity, Problem: "neither JSON, protobuf, CBOR nor a k8s:enc: prefix"},
		},
		{
			name: "truncated protobuf envelope", value: append([]byte("k8s\x00"), 0x0a, 0x7f),
			want: Stored{Encoding: Unknown, Provider: Identity, Problem: "protobuf envelope does not decode"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.value)
			if got != tc.want {
				t.Errorf("Classify = %+v, want %+v", got, tc.want)
			}
			if strings.Contains(fmt.Sprintf("%#v %s", got, got.KeyLabel()), planted) {
				t.Errorf("the classification carries the planted value: %#v", got)
			}
			for _, key := range tc.matches {
				if !mustParseKey(t, key).matches(got, tc.value) {
					t.Errorf("--expect-key %s does not match, want a match", key)
				}
			}
			if tc.not != "" && mustParseKey(t, tc.not).matches(got, tc.value) {
				t.Errorf("--expect-key %s matches, want no match", tc.not)
			}
		})
	}
}

func mustParseKey(t *testing.T, s string) KeyWant {
	t.Helper()
	k, err := ParseKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestClassifyPlantedHeaders plants values in every root field a header
// reader could take for the type (another case of apiVersion and kind, a
// nested kind): the API server decodes case-sensitively, and so does
// verify, in JSON and CBOR alike.
func TestClassifyPlantedHeaders(t *testing.T) {
	obj := map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"apiversion": planted, "APIVERSION": planted, "ApiVersion": planted, "Kind": planted, "KIND": planted,
		"metadata": map[string]any{"name": "w", "namespace": "ns"},
		"spec":     map[string]any{"kind": planted, "apiVersion": planted},
	}
	asJSON, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	// Each planted field after the real one it shadows, so that a reader
	// that lets a later match win would take it.
	after := []byte(`{"apiVersion":"example.com/v1","kind":"Widget","apiversion":"` + planted + `","APIVERSION":"` + planted +
		`","Kind":"` + planted + `","KIND":"` + planted + `","metadata":{"name":"w"},"spec":{"kind":"` + planted + `"}}`)
	asCBOR := encode(t, cbor.NewSerializer(scheme.Scheme, scheme.Scheme), &unstructured.Unstructured{Object: obj})
	for name, value := range map[string][]byte{"JSON": asJSON, "JSON, planted after": after, "CBOR": asCBOR} {
		got := Classify(value)
		if got.APIVersion != "example.com/v1" || got.Kind != "Widget" {
			t.Errorf("%s: classified as %q %q, want example.com/v1 Widget", name, got.APIVersion, got.Kind)
		}
		if strings.Contains(fmt.Sprintf("%#v %s", got, got.KeyLabel()), planted) {
			t.Errorf("%s: the classification carries the planted value: %#v", name, got)
		}
	}
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want KeyWant
		err  string
	}{
		{in: "identity", want: KeyWant{Identity: true, Given: "identity"}},
		{in: "aescbc:key2", want: KeyWant{Provider: "aescbc", Name: "key2", Given: "aescbc:key2"}},
		{in: "kmsv2:plugin", want: KeyWant{Provider: "kmsv2", Name: "plugin", Given: "kmsv2:plugin"}},
		{in: "aescbc:2026:a", want: KeyWant{Provider: "aescbc", Name: "2026:a", Given: "aescbc:2026:a"}},
		{in: "key2", want: KeyWant{KeyID: "key2", Given: "key2"}},
		{in: "vault:kek:3", want: KeyWant{KeyID: "vault:kek:3", Given: "vault:kek:3"}},
		{in: "aescbc:", err: `--expect-key "aescbc:" names a provider without a key name`},
		{in: " key2", err: `--expect-key " key2" has spaces around it`},
	} {
		got, err := ParseKey(tc.in)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("ParseKey(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseKey(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestKeyLabel(t *testing.T) {
	for _, tc := range []struct {
		s    Stored
		want string
	}{
		{Stored{Encoding: JSON, Provider: Identity}, "identity"},
		{Stored{Encoding: Encrypted, Provider: "aesgcm", Key: "k"}, "aesgcm:k"},
		{Stored{Encoding: Encrypted, Provider: "kmsv2", Key: "p", KeyID: "id"}, "kmsv2:p (key ID id)"},
	} {
		if got := tc.s.KeyLabel(); got != tc.want {
			t.Errorf("%+v: KeyLabel = %q, want %q", tc.s, got, tc.want)
		}
	}
}
