package migrator

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// Re-encryption after an encryption key rotation.
//
// A rewrite stores an object under the key the API server that takes it
// writes with: the first provider of its encryption configuration, or, for
// a KMS v2 provider, the key ID its plugin reported last. A rotation makes
// a new key the first (or the plugin reports a new key ID), and every
// object stays under the old key until it is written again. So a resource
// named in Migrator.ReEncrypt needs a pass once every API server encrypts
// with the new state, and a pass through a server that has not switched
// writes under the old key again.
//
// kube-apiserver says what it loaded in its own metrics, which restow reads
// from each server at its own address, as it reads each one's discovery
// (switch.go):
//   - apiserver_encryption_config_controller_last_config_info{hash}: the
//     sha256 of the encryption configuration file the server loaded, at
//     start and after each automatic reload (set once the new providers are
//     in place);
//   - apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds
//     {provider_name,key_id_hash}: the hash of the key ID each KMS v2
//     plugin's Status reported, with when; the latest per provider is the
//     key ID the server writes with once it has made a data key for it.
// Resolve waits (a *WaitError) until every server reports one state, and
// records it in Target.Encryption with each server's epoch: when its
// process started (process_start_time_seconds), how many times it reloaded
// its encryption configuration
// (apiserver_encryption_config_controller_automatic_reloads_total), and the
// latest KMS v2 key-ID stamp it showed. Migrate reads them again at its end
// and reports, in Result.EncryptionMoved, a state that moved meanwhile, or a
// server that restarted, reloaded or stamped another key ID since the
// migration began (the checkpoint keeps the epochs across resumes), so that
// no one takes the pass for a re-encryption under a state it did not
// cover: a server rolled back to the old configuration and forward again
// within the pass shows the same state at both ends, and wrote under the
// old key between them. Where restow cannot read every server (servers it counts but has
// no address of, a client configuration that verifies nothing), it does
// not re-encrypt on its own and says why.

const (
	configInfoMetric   = "apiserver_encryption_config_controller_last_config_info"
	kmsKeyIDMetric     = "apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds"
	reloadsMetric      = "apiserver_encryption_config_controller_automatic_reloads_total"
	processStartMetric = "process_start_time_seconds"
)

// ServerEpoch is one API server's life as its metrics show it when restow
// read them. A restart, a reload of the encryption configuration, or a KMS
// v2 key ID stamped after KMSStampedBy other than the one the state names,
// begins another: the server may have written under another key since.
type ServerEpoch struct {
	// Address is the server's own address; "" for the one server restow
	// reaches through its client configuration.
	Address string
	// ProcessStart is process_start_time_seconds, in milliseconds.
	ProcessStart int64
	// Reloads counts the successful automatic reloads of the encryption
	// configuration.
	Reloads int64
	// KMSStampedBy is the latest KMS v2 key-ID stamp the server showed, in
	// milliseconds of its own clock; 0 without KMS v2.
	KMSStampedBy int64
}

// EncryptionState is what an API server encrypts writes with, by its own
// metrics.
type EncryptionState struct {
	// ConfigHash is the hash ("sha256:...") of the encryption
	// configuration file the server loaded; "" when it runs without one.
	ConfigHash string
	// KMSKeyIDHashes are, for each KMS v2 provider, "provider=hash of the
	// key ID" its plugin reported last, sorted.
	KMSKeyIDHashes []string
	// Servers are each server's epoch when the state was read: a pass
	// holds only if every one kept its epoch to the end.
	Servers []ServerEpoch
}

// Equal reports whether s and o are the same state, whatever the servers'
// epochs.
func (s EncryptionState) Equal(o EncryptionState) bool {
	return s.ConfigHash == o.ConfigHash && slices.Equal(s.KMSKeyIDHashes, o.KMSKeyIDHashes)
}

// String says what s is, for status and logs.
func (s EncryptionState) String() string {
	var b strings.Builder
	if s.ConfigHash == "" {
		b.WriteString("no encryption configuration")
	} else {
		b.WriteString("encryption configuration " + s.ConfigHash)
	}
	for _, k := range s.KMSKeyIDHashes {
		provider, hash, _ := strings.Cut(k, "=")
		fmt.Fprintf(&b, ", KMS v2 provider %s at key ID hash %s", provider, hash)
	}
	return b.String()
}

// reEncrypts reports whether restow re-encrypts gr after a rotation.
func (m *Migrator) reEncrypts(gr schema.GroupResource) bool {
	return slices.Contains(m.ReEncrypt, gr)
}

// agreedEncryption reads every API server's metrics and returns the one
// state they all report, with each one's epoch, or a *WaitError that says
// what each reported, or why restow cannot read them all.
func (m *Migrator) agreedEncryption(ctx context.Context, target Target) (EncryptionState, error) {
	state, _, err := m.readEncryptionStates(ctx, target)
	return state, err
}

// readEncryptionStates reads every API server's metrics: the state they
// agree on, with each one's epoch, and what each showed.
func (m *Migrator) readEncryptionStates(ctx context.Context, target Target) (EncryptionState, []serverReading, error) {
	gr := target.Resource.GroupResource()
	if target.LagWait == 0 {
		// One API server, by every signal (lag.go: one that publishes no
		// address, as on a single loopback server, says nothing either
		// way): the one restow talks to.
		client, err := m.metricsClient("")
		if err != nil {
			return EncryptionState{}, nil, &WaitError{Message: fmt.Sprintf("restow cannot read the API server's metrics to learn which encryption configuration it loaded, so it does not re-encrypt %s on its own: %v", gr, err)}
		}
		reading, err := readEncryption(ctx, client)
		if err != nil {
			return EncryptionState{}, nil, &WaitError{Message: fmt.Sprintf("restow cannot read the API server's metrics to learn which encryption configuration it loaded, so it does not re-encrypt %s yet: %s", gr, Message(err))}
		}
		state := reading.state
		state.Servers = []ServerEpoch{reading.epoch}
		return state, []serverReading{reading}, nil
	}
	why := target.unseen
	switch {
	case why != "":
	case len(target.APIServerAddresses) == 0:
		why = "it has the address of none of them"
	case m.canVerifyServers() != nil:
		why = m.canVerifyServers().Error()
	}
	if why != "" {
		return EncryptionState{}, nil, &WaitError{Message: fmt.Sprintf(
			"restow cannot read each API server's metrics (%s), so it cannot know that every one encrypts with the new key, and does not re-encrypt %s on its own; once every server has loaded the configuration, kubectl restow migrate %s re-encrypts by hand",
			why, gr, gr)}
	}
	readings := make([]serverReading, len(target.APIServerAddresses))
	errs := make([]error, len(target.APIServerAddresses))
	var wg sync.WaitGroup
	for i, address := range target.APIServerAddresses {
		wg.Go(func() {
			client, err := m.metricsClient(address)
			if err == nil {
				readings[i], err = readEncryption(ctx, client)
				readings[i].epoch.Address = address
			}
			errs[i] = err
		})
	}
	wg.Wait()
	states := make([]EncryptionState, len(readings))
	for i := range readings {
		states[i] = readings[i].state
	}
	state, err := agree(gr, target.APIServerAddresses, states, errs)
	if err != nil {
		return EncryptionState{}, nil, err
	}
	for _, r := range readings {
		state.Servers = append(state.Servers, r.epoch)
	}
	return state, readings, nil
}

// agree returns the one state every server reported, or a *WaitError that
// says what each did: a server that could not be read, or reported another
// state, may still write under another key.
func agree(gr schema.GroupResource, addresses []string, states []EncryptionState, errs []error) (EncryptionState, error) {
	said := make([]string, len(addresses))
	agreed := true
	for i, address := range addresses {
		switch {
		case errs[i] != nil:
			said[i] = fmt.Sprintf("%s cannot be read (%s)", address, Message(errs[i]))
			agreed = false
		default:
			said[i] = fmt.Sprintf("%s has loaded %s", address, states[i])
			agreed = agreed && states[i].Equal(states[0])
		}
	}
	if !agreed {
		return EncryptionState{}, &WaitError{Message: fmt.Sprintf(
			"Waiting for every API server to load one encryption configuration before re-encrypting %s: a rewrite through a server that has not stores under the old key again. Each server's own metrics show: %s",
			gr, strings.Join(said, "; "))}
	}
	return states[0], nil
}

// metricsClient is a client of the API server at address (Config's host
// when ""), with Config's credentials, verifying the server's certificate
// under APIServerServiceName when it reaches one at its own address.
func (m *Migrator) metricsClient(address string) (rest.Interface, error) {
	if m.Config == nil {
		return nil, errors.New("restow has no client configuration")
	}
	if address != "" {
		dc, err := m.serverDiscovery(address)
		if err != nil {
			return nil, err
		}
		return dc.RESTClient(), nil
	}
	cfg := rest.CopyConfig(m.Config)
	cfg.APIPath = ""
	cfg.Timeout = probeTimeout
	cfg.RateLimiter = nil
	dc, err := clientdiscovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return dc.RESTClient(), nil
}

// serverReading is what one API server's metrics say: the state it
// encrypts with, its epoch, and when each KMS v2 key ID was stamped
// ("provider=hash" to milliseconds of its clock).
type serverReading struct {
	state  EncryptionState
	epoch  ServerEpoch
	stamps map[string]int64
}

// readEncryption reads one API server's metrics and says what it encrypts
// with. A KMS v2 key ID counts only once the server's health check passes
// after the metrics were read: kube-apiserver records the key ID a plugin
// reports before it makes a data key for it, under the probe's lock, and
// a health check waits for that lock and fails while the server could not
// make one (it then goes on writing under the old key ID).
func readEncryption(ctx context.Context, client rest.Interface) (serverReading, error) {
	raw, err := client.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return serverReading{}, err
	}
	reading, err := parseServerMetrics(raw)
	switch {
	case err != nil:
		return serverReading{}, err
	case reading.epoch.ProcessStart == 0:
		// Without it a restart during a pass goes unseen.
		return serverReading{}, fmt.Errorf("its metrics have no %s, so restow cannot tell whether it restarts during a pass", processStartMetric)
	case len(reading.state.KMSKeyIDHashes) == 0:
		return reading, nil
	}
	if body, err := client.Get().AbsPath("/healthz").DoRaw(ctx); err != nil {
		return serverReading{}, fmt.Errorf("its health check fails, so its KMS v2 plugin may not have given it a data key for the key ID it reports, and it may still write under the old one: %s %s", Message(err), strings.TrimSpace(string(body)))
	}
	return reading, nil
}

// ParseEncryptionMetrics reads what an API server encrypts with from its
// metrics in the Prometheus text format: only the families restow reads
// are parsed, the rest (megabytes on a busy server) is skipped line by
// line.
func ParseEncryptionMetrics(raw []byte) (EncryptionState, error) {
	reading, err := parseServerMetrics(raw)
	return reading.state, err
}

// readFamilies are the metric families restow reads of an API server.
var readFamilies = []string{configInfoMetric, kmsKeyIDMetric, reloadsMetric, processStartMetric}

func parseServerMetrics(raw []byte) (serverReading, error) {
	kept, err := keepFamilies(raw, readFamilies)
	if err != nil {
		return serverReading{}, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(kept)
	if err != nil {
		return serverReading{}, fmt.Errorf("parsing metrics: %w", err)
	}
	var r serverReading
	if f := families[configInfoMetric]; f != nil {
		hashes := map[string]bool{}
		for _, metric := range f.GetMetric() {
			hashes[label(metric, "hash")] = true
		}
		if len(hashes) != 1 {
			// A server reports the one configuration it loaded last.
			return serverReading{}, fmt.Errorf("%s reports %d configurations", configInfoMetric, len(hashes))
		}
		for h := range hashes {
			r.state.ConfigHash = h
		}
	}
	if f := families[kmsKeyIDMetric]; f != nil {
		latest := map[string]*dto.Metric{}
		r.stamps = map[string]int64{}
		for _, metric := range f.GetMetric() {
			provider := label(metric, "provider_name")
			if last := latest[provider]; last == nil || metric.GetGauge().GetValue() > last.GetGauge().GetValue() {
				latest[provider] = metric
			}
			stamp := millis(metric.GetGauge().GetValue())
			r.stamps[provider+"="+label(metric, "key_id_hash")] = stamp
			r.epoch.KMSStampedBy = max(r.epoch.KMSStampedBy, stamp)
		}
		for provider, metric := range latest {
			r.state.KMSKeyIDHashes = append(r.state.KMSKeyIDHashes, provider+"="+label(metric, "key_id_hash"))
		}
		slices.Sort(r.state.KMSKeyIDHashes)
	}
	if f := families[reloadsMetric]; f != nil {
		for _, metric := range f.GetMetric() {
			if label(metric, "status") == "success" {
				r.epoch.Reloads += int64(metric.GetCounter().GetValue())
			}
		}
	}
	if f := families[processStartMetric]; f != nil && len(f.GetMetric()) > 0 {
		r.epoch.ProcessStart = millis(f.GetMetric()[0].GetGauge().GetValue())
	}
	return r, nil
}

// keepFamilies keeps, of a server's /metrics text, the lines of families
// (readFamilies for encryption): the rest, most of the text, is never
// parsed.
func keepFamilies(raw []byte, families []string) (*bytes.Buffer, error) {
	var kept bytes.Buffer
	lines := bufio.NewScanner(bytes.NewReader(raw))
	lines.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for lines.Scan() {
		line := lines.Bytes()
		name := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("# HELP ")), []byte("# TYPE "))
		if slices.ContainsFunc(families, func(f string) bool {
			return bytes.HasPrefix(name, []byte(f)) && len(name) > len(f) && (name[len(f)] == ' ' || name[len(f)] == '{')
		}) {
			kept.Write(line)
			kept.WriteByte('\n')
		}
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	return &kept, nil
}

func millis(seconds float64) int64 { return int64(seconds * 1000) }

func label(metric *dto.Metric, name string) string {
	for _, l := range metric.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
