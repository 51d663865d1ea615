package migrator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/endpoints/discovery"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/restow/restow/internal/migrator/pace"
)

// Knowing that every API server has switched, rather than waiting out the
// lag bound (lag.go counts the servers).
//
// Each API server publishes, in its own discovery, the storageVersionHash
// of the version it stores a resource at. For a CRD, kube-apiserver's
// discovery controller and its request handler read the same CRD informer:
// once a server's discovery shows the hash of the target version, that
// server's informer has seen the CRD update, and its handler drops the
// storage of the old version as it handles the same event (informerLag is
// the margin for the two to agree, as on one server). So restow reaches
// each counted server at its own address (the default/kubernetes
// EndpointSlices, or the addresses the user names), verifies its
// certificate against the cluster's certificate authority under the
// kubernetes Service's name, and reads that server's discovery of the
// target's group version. The first pass starts informerLag after the last
// server showed the target, and the settle window counts from then.
//
// Where restow cannot know, it falls back to the bound: a counted server
// it has no address for (more servers counted than addresses), an address
// it cannot reach or whose certificate does not verify, a client
// configuration that verifies nothing. A server that it reaches and that
// still stores at another version holds the first pass back for as long as
// it does, past the bound, up to Migrator.LagLimit, and the migration then
// stops, Stalled, with nothing rewritten or pruned.
//
// What a hash does not say: which generation of the CRD the server has
// seen. A server that lags across a switch away and back (A to B to A
// within its lag) shows A's hash for the older generation and will yet
// store at B for a while. restow's watch of the CRD (history.go) ends a
// migration at the state at B, and the next one waits for every server
// again, but it cannot see which state a server has reached: a switch away
// and back that completes before a migration begins, within one server's
// lag, is not covered; docs/architecture.md says what that leaves. A change
// of the CRD that keeps its storage version leaves a switched server
// switched.

const (
	// APIServerServiceName is the name an API server's serving certificate
	// is verified against: the kubernetes Service's, which every API
	// server's certificate carries.
	APIServerServiceName = "kubernetes.default.svc"
	// DefaultLagLimit is Migrator.LagLimit by default.
	DefaultLagLimit = 10 * time.Minute
	// switchPoll spaces the reads of every API server's discovery.
	switchPoll = 250 * time.Millisecond
	// probeTimeout bounds one read of one server's discovery.
	probeTimeout = 5 * time.Second
)

// serverSwitch is what one read of an API server's discovery showed.
type serverSwitch struct {
	address string
	// hash is the storageVersionHash the server shows; "" when err is set
	// or it does not serve the resource.
	hash string
	// stores is the version the server stores the target at, by its hash;
	// "" when err is set, or "another version" when the hash names none
	// of the versions Resolve knew.
	stores string
	// err says why the server could not be reached or verified.
	err string
}

// switchState is what the wait for every API server has seen so far.
type switchState struct {
	// switched holds the addresses seen storing at the target: a server
	// does not go back for the same generation of the CRD, and one that
	// restarts reads the CRD as it is.
	switched map[string]bool
	// lagging holds since when each server reached has shown another
	// version.
	lagging map[string]time.Time
	// lastSwitch is when the last server was first seen switched.
	lastSwitch time.Time
}

// awaitSwitch waits until every API server stores at the target version,
// sets when that was (switchedBy, and the settle window from it), and
// returns. With one API server that is informerLag after Resolve saw the
// switch; with several, when each showed it in its own discovery, or, for
// servers restow cannot see, the lag bound. Only a first pass that has done
// nothing reads the servers: one that resumes after objects were done had
// every server switch before them.
func (mg *migration) awaitSwitch(ctx context.Context) error {
	mg.mu.Lock()
	by, allSwitched, done := mg.switchedBy, mg.cp.AllSwitched, mg.cp.Done()
	mg.mu.Unlock()
	until := later(by, mg.cp.StartTime.Add(informerLag))
	if want := mg.target.storageVersionHash(); mg.target.LagWait > 0 && !allSwitched && done == 0 && want != "" && len(mg.target.APIServerAddresses) > 0 && time.Now().Before(by) {
		var err error
		if until, err = mg.pollSwitch(ctx, want, by); err != nil {
			mg.setSwitching("")
			return err
		}
	}
	return pace.SleepUntil(ctx, until)
}

// switchDecision is what one read of every API server decides: the wait
// is over (done, with by and all), it stalls (err), or it goes on (msg).
type switchDecision struct {
	done bool
	by   time.Time
	all  bool
	msg  string
	err  error
}

// pollSwitch reads every API server until each shows the target, or the
// lag bound covers those restow cannot see, or the lag limit is reached,
// and returns when every server stores at the target.
func (mg *migration) pollSwitch(ctx context.Context, want string, bound time.Time) (time.Time, error) {
	limit := bound.Add(max(mg.m.lagLimit(), mg.m.lagBound()) - mg.cp.LagWait)
	state := &switchState{switched: map[string]bool{}, lagging: map[string]time.Time{}}
	versions := mg.target.knownVersions()
	polls := 0
	var decision switchDecision
	err := wait.PollUntilContextCancel(ctx, switchPoll, true, func(ctx context.Context) (bool, error) {
		seen := mg.m.readSwitch(ctx, mg.target, want, versions)
		decision = mg.decideSwitch(ctx, state, seen, bound, limit)
		if polls++; polls%crdCheckPolls == 0 && mg.target.CRD != nil {
			// The CRD may change while the servers are read: a new
			// migration starts then, rather than a wait for a version the
			// servers no longer switch to.
			if _, err := mg.liveCRD(ctx); err != nil {
				return false, err
			}
		}
		return mg.applySwitch(decision)
	})
	return decision.by, err
}

// decideSwitch says what one read of every server, seen, decides.
func (mg *migration) decideSwitch(ctx context.Context, state *switchState, seen []serverSwitch, bound, limit time.Time) switchDecision {
	now := time.Now()
	late, unreachable := state.note(seen, mg.target.TargetVersion(), now)
	if mg.target.unseen != "" {
		unreachable = append(unreachable, mg.target.unseen)
	}
	seenBy := later(state.lastSwitch, mg.cp.StartTime).Add(informerLag)
	log := klog.FromContext(ctx)
	switch {
	case len(late) == 0 && len(unreachable) == 0:
		log.V(1).Info("Every API server shows the switch", "servers", len(seen))
		return switchDecision{done: true, by: seenBy, all: true}
	case len(late) == 0 && !now.Before(bound):
		log.Info("Relying on the lag bound for API servers restow cannot see", "unseen", unreachable)
		return switchDecision{done: true, by: later(bound, seenBy)}
	case len(late) > 0 && !now.Before(limit):
		return switchDecision{err: &StalledError{Reason: ReasonAPIServerLagging, Message: fmt.Sprintf(
			"API servers have not switched to %s %s after the switch (--apiserver-lag-limit): %s; nothing was rewritten or pruned",
			mg.target.TargetVersion(), limit.Sub(mg.cp.StartTime).Round(time.Second), strings.Join(late, "; "))}}
	}
	return switchDecision{msg: switchingMessage(mg.target, bound, limit, now, seen, late, unreachable)}
}

// storageVersionHash is what an API server's own discovery shows for the
// target once it stores at the target version: for a CRD, the hash of its
// storage version (discovery.StorageVersionHash); for another resource, the
// hash Resolve read. "" when discovery publishes none.
func (t Target) storageVersionHash() string {
	if t.CRD == nil {
		return t.StorageVersionHash
	}
	return discovery.StorageVersionHash(t.Resource.Group, t.Resource.Version, t.Kind)
}

// knownVersions are the versions a server's storageVersionHash is matched
// against to name the version it stores at: a CRD's served and stored
// versions, or a built-in group's served versions and those restow's scheme
// knows.
func (t Target) knownVersions() []string {
	if t.CRD == nil {
		return builtInVersions(t.Resource.Group, []string{t.Resource.Version})
	}
	return slices.Concat(t.CRD.ServedVersions, t.CRD.StoredVersions)
}

// crdCheckPolls is how many reads of the servers come between reads of the
// CRD while the first pass waits for them.
const crdCheckPolls = 4

// note records one read of every server and returns the servers that still
// store at another version (with since when) and those restow could not
// read. A server seen at another version stays late until it is seen at
// target again, also while it cannot be read; one seen at target stays so
// while it cannot be read (a server that restarts reads the CRD as it is),
// but not once it shows another version (an address that is not one
// server, or a CRD that changed), and its switch then counts from when it
// shows target again.
func (st *switchState) note(seen []serverSwitch, target string, now time.Time) (late, unreachable []string) {
	for _, s := range seen {
		switch {
		case s.err != "" && !st.lagging[s.address].IsZero():
			late = append(late, fmt.Sprintf("%s stored at another version (since %s) and now cannot be read: %s",
				s.address, st.lagging[s.address].UTC().Format(time.RFC3339), s.err))
		case s.err != "":
			if !st.switched[s.address] {
				unreachable = append(unreachable, s.address+": "+s.err)
			}
		case s.stores == target:
			if !st.switched[s.address] {
				st.switched[s.address] = true
				st.lastSwitch = now
			}
			delete(st.lagging, s.address)
		default:
			delete(st.switched, s.address)
			if st.lagging[s.address].IsZero() {
				st.lagging[s.address] = now
			}
			late = append(late, fmt.Sprintf("%s stores at %s (since %s)", s.address, s.stores, st.lagging[s.address].UTC().Format(time.RFC3339)))
		}
	}
	return late, unreachable
}

// switchingMessage says what the first pass waits for.
func switchingMessage(target Target, bound, limit, now time.Time, seen []serverSwitch, late, unreachable []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Waiting for every API server to store at %s before the first pass; each server's own discovery shows the version it stores at:", target.TargetVersion())
	var switched []string
	for _, s := range seen {
		if s.err == "" && s.stores == target.TargetVersion() {
			switched = append(switched, s.address)
		}
	}
	if len(switched) > 0 {
		fmt.Fprintf(&b, " %s at %s;", strings.Join(switched, ", "), target.TargetVersion())
	}
	if len(late) > 0 {
		fmt.Fprintf(&b, " %s;", strings.Join(late, "; "))
	}
	if len(unreachable) > 0 {
		fmt.Fprintf(&b, " not known: %s;", strings.Join(unreachable, "; "))
	}
	switch {
	case len(late) > 0 && !now.Before(bound):
		fmt.Fprintf(&b, " past the lag bound of %s, restow holds back while a server it reaches lags, until %s (--apiserver-lag-limit), then stops", target.LagWait, limit.UTC().Format(time.RFC3339))
	case len(unreachable) > 0:
		fmt.Fprintf(&b, " for servers it cannot see restow relies on the lag bound: it waits at least until %s (--apiserver-lag-bound), and a server it reaches that still lags then holds the pass back until %s (--apiserver-lag-limit)", bound.UTC().Format(time.RFC3339), limit.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintf(&b, " a server that still lags at %s (--apiserver-lag-bound) holds the pass back until %s (--apiserver-lag-limit)", bound.UTC().Format(time.RFC3339), limit.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// readSwitch reads every address of target's API servers at once.
func (m *Migrator) readSwitch(ctx context.Context, target Target, want string, versions []string) []serverSwitch {
	seen := make([]serverSwitch, len(target.APIServerAddresses))
	var wg sync.WaitGroup
	for i, address := range target.APIServerAddresses {
		wg.Go(func() {
			seen[i] = m.readServer(ctx, address, target, want, versions)
		})
	}
	wg.Wait()
	return seen
}

// readServer reads one API server's own discovery of the target's group
// version at address, verifying its certificate under the kubernetes
// Service's name, and says which version it stores the target at.
func (m *Migrator) readServer(ctx context.Context, address string, target Target, want string, versions []string) serverSwitch {
	s := serverSwitch{address: address}
	dc, err := m.serverDiscovery(address)
	if err != nil {
		s.err = err.Error()
		return s
	}
	gv := target.Resource.GroupVersion()
	resources, err := groupVersionDocument(ctx, dc, gv)
	switch {
	case apierrors.IsNotFound(err):
		// A server that answers, verified, and does not serve the group
		// version has not seen the CRD as it is: it lags.
		s.stores = "no version: it does not serve " + gv.String() + " yet"
		return s
	case err != nil:
		s.err = Message(err)
		return s
	}
	i := slices.IndexFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == target.Resource.Resource })
	switch {
	case i < 0:
		s.stores = "no version: it does not serve " + target.Resource.Resource + " in " + gv.String() + " yet"
	case resources.APIResources[i].StorageVersionHash == want:
		s.hash, s.stores = want, target.TargetVersion()
	default:
		s.hash = resources.APIResources[i].StorageVersionHash
		s.stores = versionWithHash(gv.Group, target.Kind, versions, s.hash)
		if s.stores == "" || s.stores == target.TargetVersion() {
			// Another hash is another version, whatever name restow
			// would give it.
			s.stores = fmt.Sprintf("another version (storageVersionHash %q)", s.hash)
		}
	}
	return s
}

// groupVersionDocument reads the discovery document of gv from the API
// server of dc: its resources, each with its storageVersionHash.
func groupVersionDocument(ctx context.Context, dc *clientdiscovery.DiscoveryClient, gv schema.GroupVersion) (*metav1.APIResourceList, error) {
	path := "/apis/" + gv.String()
	if gv.Group == "" {
		path = "/api/" + gv.Version // the core group's
	}
	resources := &metav1.APIResourceList{}
	return resources, dc.RESTClient().Get().AbsPath(path).Do(ctx).Into(resources)
}

// serverDiscovery is a discovery client of the API server at address,
// with Config's credentials and certificate authority, verifying the
// server's certificate under APIServerServiceName. It refuses a
// configuration that would verify nothing.
func (m *Migrator) serverDiscovery(address string) (*clientdiscovery.DiscoveryClient, error) {
	if dc, ok := m.probes.Load(address); ok {
		return dc.(*clientdiscovery.DiscoveryClient), nil
	}
	if err := m.canVerifyServers(); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(m.Config)
	cfg.Host = "https://" + address
	cfg.APIPath = ""
	cfg.ServerName = APIServerServiceName
	cfg.Timeout = probeTimeout
	cfg.RateLimiter = nil
	dc, err := clientdiscovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	actual, _ := m.probes.LoadOrStore(address, dc)
	return actual.(*clientdiscovery.DiscoveryClient), nil
}

// serverMetadata is a metadata client of the API server at address,
// verified as serverDiscovery's, without its short timeout (it lists pages)
// and sharing Config's rate limiter. Its answers do not reach pace.Throttle:
// a 429 from another server slows only its own page's retries.
func (m *Migrator) serverMetadata(address string) (metadata.Interface, error) {
	if c, ok := m.listers.Load(address); ok {
		return c.(metadata.Interface), nil
	}
	if err := m.canVerifyServers(); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(m.Config)
	cfg.Host = "https://" + address
	cfg.ServerName = APIServerServiceName
	c, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	actual, _ := m.listers.LoadOrStore(address, c)
	return actual.(metadata.Interface), nil
}

// canVerifyServers says why restow's client configuration cannot reach an
// API server at its own address and verify it, or returns nil.
func (m *Migrator) canVerifyServers() error {
	switch {
	case m.Config == nil:
		return errors.New("restow has no client configuration to reach API servers at their own addresses")
	case m.Config.Insecure:
		return errors.New("the client configuration skips TLS verification, so no server's certificate can be verified")
	case len(m.Config.CAData) == 0 && m.Config.CAFile == "":
		return errors.New("the client configuration names no certificate authority to verify API servers against")
	}
	return nil
}

// verifiesServers reports whether restow's client configuration can reach
// an API server at its own address and verify it (canVerifyServers says
// why not).
func (m *Migrator) verifiesServers() bool { return m.canVerifyServers() == nil }

// ParseAPIServerAddresses parses a comma-separated list of API server
// addresses, each host:port (an IPv6 address in brackets), as
// --apiservers takes it; "" is none.
func ParseAPIServerAddresses(list string) ([]string, error) {
	var addresses []string
	for a := range strings.SplitSeq(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("%q is not host:port: %w", a, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || host == "" {
			return nil, fmt.Errorf("%q is not host:port with a port from 1 to 65535", a)
		}
		if !slices.Contains(addresses, a) {
			addresses = append(addresses, a)
		}
	}
	return addresses, nil
}

func (m *Migrator) lagLimit() time.Duration {
	if m.LagLimit <= 0 {
		return DefaultLagLimit
	}
	return m.LagLimit
}
