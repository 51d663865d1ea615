package migrator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// serverMetrics is part of what kube-apiserver 1.37 serves at /metrics with
// a KMS v2 provider whose key ID changed from k1 to k2 (the second status
// is the later), among lines of other families that must be skipped.
const serverMetrics = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",verb="GET"} 42
# HELP apiserver_encryption_config_controller_last_config_info [ALPHA] Information about the last applied encryption configuration with hash as label, split by apiserver identity.
# TYPE apiserver_encryption_config_controller_last_config_info gauge
apiserver_encryption_config_controller_last_config_info{apiserver_id_hash="sha256:aa",hash="sha256:c78b"} 1
# HELP apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds [ALPHA] The last time in seconds when a keyID was returned by the Status RPC call.
# TYPE apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds gauge
apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds{apiserver_id_hash="sha256:aa",key_id_hash="sha256:k1",provider_name="testkms"} 1.7962e+09
apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds{apiserver_id_hash="sha256:aa",key_id_hash="sha256:k2",provider_name="testkms"} 1.7963e+09
apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds{apiserver_id_hash="sha256:aa",key_id_hash="sha256:x",provider_name="other"} 1.7961e+09
# HELP apiserver_encryption_config_controller_automatic_reloads_total [ALPHA] Total number of reload successes and failures of encryption configuration split by apiserver identity.
# TYPE apiserver_encryption_config_controller_automatic_reloads_total counter
apiserver_encryption_config_controller_automatic_reloads_total{apiserver_id_hash="sha256:aa",status="failure"} 1
apiserver_encryption_config_controller_automatic_reloads_total{apiserver_id_hash="sha256:aa",status="success"} 2
# HELP process_start_time_seconds [ALPHA] Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.79619e+09
# HELP process_start_time_seconds_other A family whose name begins with another's.
# TYPE process_start_time_seconds_other gauge
process_start_time_seconds_other 7
# HELP apiserver_envelope_encryption_key_id_hash_total [ALPHA] Number of times a keyID is used split by transformation type, provider, and apiserver identity.
# TYPE apiserver_envelope_encryption_key_id_hash_total counter
apiserver_envelope_encryption_key_id_hash_total{apiserver_id_hash="sha256:aa",key_id_hash="sha256:k1",provider_name="testkms",transformation_type="to_storage"} 3
`

func TestParseEncryptionMetrics(t *testing.T) {
	got, err := ParseEncryptionMetrics([]byte(serverMetrics))
	if err != nil {
		t.Fatal(err)
	}
	reading, err := parseServerMetrics([]byte(serverMetrics))
	if want := (ServerEpoch{ProcessStart: 1796190000000, Reloads: 2, KMSStampedBy: 1796300000000}); err != nil || reading.epoch != want {
		t.Errorf("epoch = %+v, %v; want %+v", reading.epoch, err, want)
	}
	if len(reading.stamps) != 3 || reading.stamps["testkms=sha256:k1"] != 1796200000000 {
		t.Errorf("stamps = %v, want the three key IDs' stamps", reading.stamps)
	}
	want := EncryptionState{ConfigHash: "sha256:c78b", KMSKeyIDHashes: []string{"other=sha256:x", "testkms=sha256:k2"}}
	if !got.Equal(want) {
		t.Errorf("ParseEncryptionMetrics = %+v, want %+v (the latest key ID per provider)", got, want)
	}
	// A server without an encryption configuration reports neither family.
	none, err := ParseEncryptionMetrics([]byte("# TYPE apiserver_request_total counter\napiserver_request_total 1\n"))
	if err != nil || !none.Equal(EncryptionState{}) || none.String() != "no encryption configuration" {
		t.Errorf("without encryption: %+v (%q), %v", none, none.String(), err)
	}
	// Two configurations behind one address are not one state.
	two := serverMetrics + `apiserver_encryption_config_controller_last_config_info{apiserver_id_hash="sha256:bb",hash="sha256:0000"} 1` + "\n"
	if _, err := ParseEncryptionMetrics([]byte(two)); err == nil {
		t.Error("two configurations at one address: no error")
	}
}

// TestEpochsMoved: a pass holds only if each server kept its epoch: a
// restart, a reload (to the old configuration and back leaves the same
// state at both ends), another KMS v2 key ID stamped after the start, or a
// server not read at the start, each moves it.
func TestEpochsMoved(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	began := &EncryptionState{ConfigHash: "sha256:c2", KMSKeyIDHashes: []string{"kms=k2"}, Servers: []ServerEpoch{
		{Address: a, ProcessStart: 100, Reloads: 3, KMSStampedBy: 5000},
		{Address: b, ProcessStart: 200, Reloads: 1, KMSStampedBy: 5100},
	}}
	same := func() []serverReading {
		return []serverReading{
			{epoch: ServerEpoch{Address: a, ProcessStart: 100, Reloads: 3, KMSStampedBy: 65000}, stamps: map[string]int64{"kms=k2": 65000, "kms=k1": 4000}},
			{epoch: ServerEpoch{Address: b, ProcessStart: 200, Reloads: 1, KMSStampedBy: 65100}, stamps: map[string]int64{"kms=k2": 65100}},
		}
	}
	for _, tc := range []struct {
		name   string
		change func([]serverReading) []serverReading
		want   string
	}{
		{"kept, the key ID stamped again each minute", func(r []serverReading) []serverReading { return r }, ""},
		{"restarted", func(r []serverReading) []serverReading { r[1].epoch.ProcessStart = 300; return r }, b + " restarted"},
		{"reloaded away and back", func(r []serverReading) []serverReading { r[0].epoch.Reloads = 5; return r }, a + " reloaded its encryption configuration 2 times"},
		{"another key ID stamped since", func(r []serverReading) []serverReading { r[0].stamps["kms=k1"] = 30000; return r }, a + "'s KMS v2 provider kms reported another key ID"},
		{"a server not read at the start", func(r []serverReading) []serverReading {
			return append(r, serverReading{epoch: ServerEpoch{Address: "10.0.0.3:6443"}})
		}, "10.0.0.3:6443 was not read when the pass began"},
	} {
		got := epochsMoved(began, tc.change(same()))
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestAgree: restow re-encrypts only when every API server it reads reports
// one state; a server that cannot be read, or reports another, holds it
// back, and the message names it.
func TestAgree(t *testing.T) {
	gr := schema.GroupResource{Resource: "secrets"}
	addresses := []string{"10.0.0.1:6443", "10.0.0.2:6443"}
	a, b := EncryptionState{ConfigHash: "sha256:a"}, EncryptionState{ConfigHash: "sha256:b"}
	for _, tc := range []struct {
		name   string
		states []EncryptionState
		errs   []error
		says   string
	}{
		{name: "one state", states: []EncryptionState{b, b}, errs: []error{nil, nil}},
		{name: "the second not reloaded", states: []EncryptionState{b, a}, errs: []error{nil, nil}, says: "10.0.0.2:6443 has loaded encryption configuration sha256:a"},
		{name: "the first not reloaded", states: []EncryptionState{a, b}, errs: []error{nil, nil}, says: "10.0.0.1:6443 has loaded encryption configuration sha256:a"},
		{name: "the second unread", states: []EncryptionState{b, {}}, errs: []error{nil, errors.New("connection refused")}, says: "10.0.0.2:6443 cannot be read (connection refused)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := agree(gr, addresses, tc.states, tc.errs)
			var waiting *WaitError
			switch {
			case tc.says == "" && (err != nil || !got.Equal(b)):
				t.Errorf("agree = %+v, %v; want %+v", got, err, b)
			case tc.says != "" && (!errors.As(err, &waiting) || !strings.Contains(waiting.Message, tc.says)):
				t.Errorf("agree = %+v, %v; want a WaitError saying %q", got, err, tc.says)
			}
		})
	}
}

// TestBuiltInPassesOneAtATime: by default one pass over a built-in
// resource lists and rewrites at a time, within MaxPasses, while passes
// over CRDs still take the other slots.
func TestBuiltInPassesOneAtATime(t *testing.T) {
	m := &Migrator{MaxPasses: 3}
	release, err := m.passSlot(t.Context(), true)
	if err != nil {
		t.Fatal(err)
	}
	if !m.slotsBusy(true) || m.slotsBusy(false) {
		t.Errorf("with one built-in pass running: busy for a built-in %v, for a CRD %v; want true, false", m.slotsBusy(true), m.slotsBusy(false))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := m.passSlot(ctx, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a second built-in pass took a slot (%v) while one ran", err)
	}
	for range 2 {
		if _, err := m.passSlot(t.Context(), false); err != nil {
			t.Fatal(err)
		}
	}
	if !m.slotsBusy(false) {
		t.Error("three passes run, MaxPasses 3: not busy")
	}
	release()
	if len(m.builtInSlots) != 0 || len(m.slots) != 2 {
		t.Errorf("after the built-in pass ended: %d built-in, %d slots taken; want 0, 2", len(m.builtInSlots), len(m.slots))
	}
}

// TestEncryptionUnknownWhereServersCannotAllBeRead: restow never assumes
// what servers it cannot read loaded.
func TestEncryptionUnknownWhereServersCannotAllBeRead(t *testing.T) {
	m := &Migrator{}
	for _, target := range []Target{
		{LagWait: DefaultLagBound, APIServers: 2, APIServerAddresses: []string{"10.0.0.1:6443"}, unseen: "2 API servers counted, 1 of them at an address"},
		{LagWait: DefaultLagBound, APIServers: 2},
	} {
		target.Resource = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
		_, err := m.agreedEncryption(t.Context(), target)
		var waiting *WaitError
		if !errors.As(err, &waiting) || !strings.Contains(waiting.Message, "cannot read each API server's metrics") {
			t.Errorf("%+v: agreedEncryption = %v, want a wait saying it cannot read each server", target, err)
		}
	}
}
