package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/endpoints/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/storedversions"
)

// Target is a resource resolved for a migration.
type Target struct {
	// Resource is the group, version and resource the pass lists and rewrites through.
	Resource   schema.GroupVersionResource
	Kind       string
	Namespaced bool
	// Namespace, when set on a namespaced resource, limits the migration to
	// that namespace. Objects elsewhere are not proven, so such a migration
	// never prunes status.storedVersions.
	Namespace string
	// StorageVersion is, for a resource not served from a CRD, the version
	// discovery's storageVersionHash says the API server stores at; "" when
	// discovery does not say.
	StorageVersion string
	// StorageVersionHash is, for a resource not served from a CRD, the
	// storageVersionHash discovery published when Resolve read it: what
	// each API server's own discovery must show before the first pass.
	StorageVersionHash string
	// CRD is set when the resource is served from a CustomResourceDefinition.
	CRD *CRDState
	// LagWait is how long after Resolve saw the switch every API server
	// stores at the target version (lag.go): the lag bound with several API
	// servers or an unknown number; zero with one, and for built-in
	// resources whose discovery publishes no storageVersionHash. The first
	// pass waits for it, and the settle window counts from its end.
	LagWait time.Duration
	// APIServers is how many API servers Resolve counted for a CRD, or 0 when
	// it could not tell; APIServerSignals says what each signal said.
	APIServers       int
	APIServerSignals string
	// APIServerAddresses are where restow reaches each API server directly
	// (host:port): the addresses in default/kubernetes's EndpointSlices and
	// those Migrator.APIServerAddresses names. With several API servers the
	// first pass waits until each shows the target in its own discovery
	// (switch.go), rather than for the whole LagWait.
	APIServerAddresses []string
	// unseen, when set, says why restow cannot know that it reaches every
	// API server at APIServerAddresses: it relies on LagWait for those it
	// cannot see.
	unseen string
	// ServersUnseen says, for a resource not served from a CRD on several
	// API servers (or an unknown number), why restow cannot read every
	// server's own discovery: behind one address for several, as on a
	// managed control plane, or with a client configuration that verifies
	// nothing. No pass starts by itself for a storage version that moved
	// then, since nothing shows that every server stores at the new one;
	// "" when restow reads every server, or there is one.
	ServersUnseen string
	// Encryption is, for a resource Migrator.ReEncrypt names, what every
	// API server encrypted writes with when Resolve read their metrics
	// (encryption.go); nil for any other, and when it is not known.
	Encryption *EncryptionState
	// EncryptionUnknown says, for a resource Migrator.ReEncrypt names, why
	// Resolve does not know what every API server encrypts with (they
	// disagree, or some cannot be read); "" when Encryption is set.
	EncryptionUnknown string
}

// CRDState is what a migration remembers of a CRD when it begins.
type CRDState struct {
	Name           string
	UID            types.UID
	StorageVersion string
	Generation     int64
	// ResourceVersion is the resourceVersion Resolve read the CRD at: the
	// migration watches the CRD from it (history.go).
	ResourceVersion string
	StoredVersions  []string
	ServedVersions  []string
	// StatusSubresource says whether the storage version has a /status subresource.
	StatusSubresource bool
}

// TargetVersion is the version objects are stored at after the pass: the
// CRD's storage version or, for other resources, the version the API server
// stores at (the served version when discovery does not say).
func (t Target) TargetVersion() string {
	switch {
	case t.CRD != nil:
		return t.CRD.StorageVersion
	case t.StorageVersion != "":
		return t.StorageVersion
	}
	return t.Resource.Version
}

// Partial reports whether the migration covers only some of the
// resource's objects (one namespace): it must not prune then.
func (t Target) Partial() bool { return t.Namespaced && t.Namespace != "" }

// scope narrows resource to the target's namespace, if it has one.
func (t Target) scope(resource metadata.Getter) metadata.ResourceInterface {
	if t.Partial() {
		return resource.Namespace(t.Namespace)
	}
	return resource
}

// Resolve finds the resource, reads its CRD live, and checks that the API
// server already stores at the CRD's storage version. It returns a
// *StalledError for a resource that does not exist or whose switch cannot be
// confirmed, and a *WaitError while the API server has not switched yet.
func (m *Migrator) Resolve(ctx context.Context, gr schema.GroupResource) (Target, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	err := m.Reader.Get(ctx, client.ObjectKey{Name: gr.String()}, crd)
	switch {
	case err == nil:
		return m.resolveCRD(ctx, crd)
	case !apierrors.IsNotFound(err):
		return Target{}, &TransientError{Err: fmt.Errorf("reading CRD %s: %w", gr, err)}
	}
	mapping, err := m.restMapping(gr)
	if err != nil {
		return Target{}, err
	}
	target := Target{
		Resource:   mapping.Resource,
		Kind:       mapping.GroupVersionKind.Kind,
		Namespaced: mapping.Scope.Name() == meta.RESTScopeNameNamespace,
	}
	target.StorageVersion, target.StorageVersionHash, err = m.builtInStorageVersion(gr, mapping.GroupVersionKind.Kind)
	switch {
	case errors.Is(err, errNotServed):
		// Nothing to rewrite, and nothing rewritten: retried with the
		// Stalled backoff, in case a server that is starting lists less.
		return Target{}, &StalledError{Message: fmt.Sprintf("the API server serves no resource %s: discovery does not list it", gr)}
	case err != nil:
		// Most likely during an upgrade, when nothing may be assumed.
		return Target{}, &TransientError{Err: err}
	}
	if target.StorageVersionHash != "" {
		if target, err = m.resolveBuiltIn(ctx, target); err != nil {
			return Target{}, err
		}
	}
	// Without a storageVersionHash nothing shows which version any server
	// stores at (an aggregated API, or discovery without hashes): nothing
	// to wait for either, but the encryption state still counts.
	if !m.reEncrypts(gr) {
		return target, nil
	}
	if target.StorageVersionHash == "" {
		return Target{}, &StalledError{Message: fmt.Sprintf(
			"restow re-encrypts only resources that kube-apiserver stores itself, and discovery publishes no storageVersionHash for %s (an aggregated API's are stored by its own server): remove it from --reencrypt-resources", gr)}
	}
	state, err := m.agreedEncryption(ctx, target)
	var unknown *WaitError
	switch {
	case errors.As(err, &unknown):
		// Not known: no pass for a rotation, no record; a pass for any
		// other reason still runs, and records nothing of encryption.
		target.EncryptionUnknown = unknown.Message
	case err != nil:
		return Target{}, err
	default:
		target.Encryption = &state
	}
	return target, nil
}

// resolveBuiltIn counts the API servers for a resource that is not served
// from a CRD, as resolveCRD does: during a control-plane upgrade or
// rollback the servers store it at different versions, and a rewrite
// through one not yet upgraded stores the old version again. It reads the
// own discovery of each server at an address it has, and waits (a
// *WaitError, so no pass holds a slot meanwhile) while any stores at
// another version than the one Resolve read, or cannot be read: an upgrade
// may take hours, not the seconds of a CRD informer's lag, and restarts
// every server. The first pass then waits for the servers as a CRD's does
// (switch.go), relying on the lag bound only for servers it has no address
// of.
func (m *Migrator) resolveBuiltIn(ctx context.Context, target Target) (Target, error) {
	lagWait, servers, err := m.lagWait(ctx)
	if err != nil {
		return Target{}, err
	}
	target.LagWait, target.APIServers, target.APIServerSignals = lagWait, servers.servers, servers.signals
	target.APIServerAddresses, target.unseen = servers.addresses, servers.unseen
	if lagWait == 0 {
		return target, nil
	}
	target.ServersUnseen = servers.unseen
	switch {
	case target.ServersUnseen != "":
	case len(target.APIServerAddresses) == 0:
		target.ServersUnseen = "it has the address of none of them"
	case !m.verifiesServers():
		target.ServersUnseen = m.canVerifyServers().Error()
	}
	if len(target.APIServerAddresses) == 0 || !m.verifiesServers() {
		// No server restow can read at its own address: a pass someone
		// asks for relies on the lag bound, and status says why
		// (switch.go); none starts by itself (ServersUnseen).
		return target, nil
	}
	var said []string
	differ, unread := false, false
	for _, s := range m.readSwitch(ctx, target, target.StorageVersionHash, target.knownVersions()) {
		switch {
		case s.err != "":
			said = append(said, fmt.Sprintf("%s cannot be read (%s)", s.address, s.err))
			unread = true
		default:
			said = append(said, fmt.Sprintf("%s stores at %s", s.address, s.stores))
			differ = differ || s.hash != target.StorageVersionHash
		}
	}
	switch {
	case differ:
		return Target{}, &WaitError{Servers: true, Message: fmt.Sprintf(
			"The API servers store %s at different versions, as during a control-plane upgrade or rollback: each server's own discovery shows %s. restow re-stores once every server stores at one version",
			target.Resource.GroupResource(), strings.Join(said, "; "))}
	case unread:
		// A server restarting, as each does in an upgrade, may come back
		// at another version: nothing is known of it until it answers.
		return Target{}, &WaitError{Servers: true, Message: fmt.Sprintf(
			"restow cannot read every API server's own discovery of %s, and a server that restarts, as in an upgrade, may store at another version: %s. It looks again until each answers",
			target.Resource.GroupResource(), strings.Join(said, "; "))}
	}
	return target, nil
}

func (m *Migrator) restMapping(gr schema.GroupResource) (*meta.RESTMapping, error) {
	gvk, err := m.Mapper.KindFor(gr.WithVersion(""))
	if err == nil {
		var mapping *meta.RESTMapping
		if mapping, err = m.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err == nil {
			return mapping, nil
		}
	}
	if meta.IsNoMatchError(err) {
		return nil, &StalledError{Message: fmt.Sprintf("the API server serves no resource %s", gr)}
	}
	return nil, &TransientError{Err: fmt.Errorf("resolving %s: %w", gr, err)}
}

// builtInStorageVersion finds the storageVersionHash discovery publishes for
// the resource and the version it names: the version the API server
// encodes it at, which need not be the preferred version it serves, nor a
// served one (a server that emulates an older release may store at a
// version it does not serve). The version is looked for among those
// discovery serves and those restow's scheme knows; it is "" when the hash
// names none of them. Both are "" when discovery lists the resource
// without a hash (an aggregated API); a discovery read that fails is an
// error, never taken for that.
func (m *Migrator) builtInStorageVersion(gr schema.GroupResource, kind string) (version, hash string, err error) {
	groups, err := m.Discovery.ServerGroups()
	if err != nil {
		return "", "", fmt.Errorf("reading discovery: %w", err)
	}
	i := slices.IndexFunc(groups.Groups, func(g metav1.APIGroup) bool { return g.Name == gr.Group })
	if i < 0 {
		return "", "", errNotServed
	}
	var versions []string
	for _, v := range groups.Groups[i].Versions {
		versions = append(versions, v.Version)
	}
	for _, v := range versions {
		resources, err := m.Discovery.ServerResourcesForGroupVersion(schema.GroupVersion{Group: gr.Group, Version: v}.String())
		if err != nil {
			return "", "", fmt.Errorf("reading the discovery of %s: %w", schema.GroupVersion{Group: gr.Group, Version: v}, err)
		}
		if j := slices.IndexFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == gr.Resource }); j >= 0 {
			hash = resources.APIResources[j].StorageVersionHash
			return versionWithHash(gr.Group, kind, builtInVersions(gr.Group, versions), hash), hash, nil
		}
	}
	return "", "", errNotServed
}

// errNotServed: discovery, read without an error, does not list the
// resource, which restow's RESTMapper still maps (it caches discovery): a
// CRD deleted since, or an API removed.
var errNotServed = errors.New("discovery does not list the resource")

// builtInVersions are served, then the versions of group that client-go's
// scheme knows (every built-in group's), each once.
func builtInVersions(group string, served []string) []string {
	versions := slices.Clone(served)
	for _, gv := range clientgoscheme.Scheme.PrioritizedVersionsForGroup(group) {
		if !slices.Contains(versions, gv.Version) {
			versions = append(versions, gv.Version)
		}
	}
	return versions
}

// versionWithHash returns the version of versions whose storage version hash
// for group and kind is hash, or "".
func versionWithHash(group, kind string, versions []string, hash string) string {
	if hash == "" {
		return ""
	}
	for _, v := range versions {
		if discovery.StorageVersionHash(group, v, kind) == hash {
			return v
		}
	}
	return ""
}

func (m *Migrator) resolveCRD(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) (Target, error) {
	state := &CRDState{
		Name:            crd.Name,
		UID:             crd.UID,
		StorageVersion:  storedversions.StorageVersion(crd),
		Generation:      crd.Generation,
		ResourceVersion: crd.ResourceVersion,
		StoredVersions:  crd.Status.StoredVersions,
		ServedVersions:  storedversions.ServedVersions(crd),
	}
	if len(state.ServedVersions) == 0 {
		return Target{}, &StalledError{Message: fmt.Sprintf("CRD %s serves no version", crd.Name)}
	}
	if !crd.DeletionTimestamp.IsZero() {
		return Target{}, &StalledError{Message: fmt.Sprintf("CRD %s is being deleted", crd.Name)}
	}
	if !slices.Contains(state.ServedVersions, state.StorageVersion) {
		// Discovery publishes a storageVersionHash only for a served storage
		// version, so nothing shows when the API server has switched to it:
		// rewriting before that would re-store objects at the old version.
		return Target{}, &StalledError{Message: fmt.Sprintf(
			"the storage version %s of CRD %s is not served (served: false), so discovery publishes no storageVersionHash and restow cannot confirm the API server stores at %s; set served: true on %s (it may be turned off again after the migration)",
			state.StorageVersion, crd.Name, state.StorageVersion, state.StorageVersion)}
	}
	notServing, err := storedversions.NotServingStorageVersion(m.Discovery, crd)
	if err != nil {
		return Target{}, &TransientError{Err: err}
	}
	if notServing != "" {
		return Target{}, &WaitError{Message: notServing}
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == state.StorageVersion {
			state.StatusSubresource = v.Subresources != nil && v.Subresources.Status != nil
		}
	}
	// One API server has switched; the others may follow up to the lag
	// bound later.
	lagWait, servers, err := m.lagWait(ctx)
	if err != nil {
		return Target{}, err
	}
	// List and patch through the storage version: it is served, and objects
	// already stored at it need no conversion.
	return Target{
		Resource:           schema.GroupVersionResource{Group: crd.Spec.Group, Version: state.StorageVersion, Resource: crd.Spec.Names.Plural},
		Kind:               crd.Spec.Names.Kind,
		Namespaced:         crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		CRD:                state,
		LagWait:            lagWait,
		APIServers:         servers.servers,
		APIServerSignals:   servers.signals,
		APIServerAddresses: servers.addresses,
		unseen:             servers.unseen,
	}, nil
}

// fallbackVersions are the versions a page can be listed through when the
// list through the storage version fails: the other served versions that
// status.storedVersions lists. Objects still stored at one of them need no
// conversion to be listed through it, so a single object that cannot be
// converted does not block its page.
func (t Target) fallbackVersions() []string {
	if t.CRD == nil {
		return nil
	}
	var versions []string
	for _, v := range t.CRD.StoredVersions {
		if v != t.Resource.Version && slices.Contains(t.CRD.ServedVersions, v) {
			versions = append(versions, v)
		}
	}
	return versions
}
