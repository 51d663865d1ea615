// Package migrator owns a whole migration of one resource: resolve it, wait
// until the API server stores at the new version, list in pages, rewrite
// every object with bounded concurrency (a CRD's objects written back as
// listed, others through a no-op merge patch), classify each result, report
// progress, and finish: wait out the settle window, rewrite again what others
// wrote within it, and prune a CRD's status.storedVersions. It knows nothing
// of reconcile loops, so the operator and the CLI run the same migration.
//
// The files follow the data path, and calls go one way along it:
//   - migrator.go: the Migrator and its clients; slots.go: its budget of
//     passes; target.go: Resolve, which makes a Target of a resource, a CRD
//     or a built-in one; lag.go: how many API servers there are
//     and the lag bound; switch.go: knowing when every one has switched
//     (migrate.go waits on it); count.go: how many objects a Target has.
//   - migrate.go: the entry, Migrate and FirstPass, and the state of one
//     migration (newMigration decides whether a checkpoint resumes).
//   - pass.go: the page loop of one pass; list.go: its list (isolate.go
//     takes apart a page that one object fails); write.go: one object's
//     rewrite, as an update or a merge patch, with its retries; request.go:
//     the raw requests both send for whole objects.
//   - history.go: the CRD as watched since the migration began, and its
//     live reads (liveCRD), which say whether a CRD whose spec changed
//     meanwhile still allows the prune; finish.go: the settle window and
//     the re-check; encryptionmoved.go: what the end of a pass under an
//     encryption target reads again.
//   - Leaves used along the way: types.go (the public vocabulary), progress.go
//     (what is reported), proof.go (what proves an object stored at the
//     target), errors.go (what an answer means), and package pace (how many
//     rewrites are in flight).
package migrator

import (
	"sync"
	"sync/atomic"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/restow/restow/internal/migrator/pace"
	"github.com/restow/restow/internal/migrator/quota"
)

// Migrator runs migrations. Its clients must not be cached: every decision is
// made on a live read.
type Migrator struct {
	// Client writes CRD status (pruning).
	Client client.Client
	// Reader reads CRDs live.
	Reader client.Reader
	// Metadata lists and patches objects as metadata only.
	Metadata metadata.Interface
	// Objects, if set, lists a CRD's objects whole and writes them back as
	// listed in the first pass (write.go); without it every rewrite is a
	// merge patch.
	Objects rest.Interface
	// Discovery shows which storage version the API server uses.
	Discovery clientdiscovery.DiscoveryInterface
	// Mapper resolves resources that are not served from a CRD.
	Mapper meta.RESTMapper
	// BodyBytes bounds the bytes of listed objects that all of this
	// Migrator's passes hold at once to write back as listed; a page that
	// would pass it is patched instead. Zero means DefaultBodyBytes.
	BodyBytes int64
	// bodyBytes is what the passes hold now.
	bodyBytes atomic.Int64
	// MaxPasses bounds the passes that list and rewrite at once (waiting
	// out the lag bound or the settle window takes no slot); others wait
	// for one. Zero means DefaultMaxPasses.
	MaxPasses int
	// SlotsChanged, if set, is told how many passes list and rewrite now,
	// whenever that changes (for a metric).
	SlotsChanged func(running int)
	slotsOnce    sync.Once
	slots        chan struct{}
	// MaxBuiltInPasses bounds, within MaxPasses, the passes over resources
	// not served from a CRD (built-in ones: after an upgrade or a key
	// rotation many may move at once, Secrets and ConfigMaps among them,
	// and each is read by the whole cluster). Zero means
	// DefaultMaxBuiltInPasses.
	MaxBuiltInPasses int
	builtInSlots     chan struct{}
	// rewriting is open while no pass holds a slot (gate.go).
	rewriting gate
	// Throttle, if set, sees the API server's 429 answers to Metadata's
	// and Objects' requests, so passes slow down at once (package pace).
	Throttle *pace.Throttle
	// LagBound is how long any API server of the control plane may take to
	// switch a CRD's storage version after another has (lag.go): with
	// several API servers the first pass waits that long. Zero means
	// DefaultLagBound.
	LagBound time.Duration
	// AssumeSeveral skips counting the API servers by their identity Leases
	// and waits for LagBound as with several: for control planes whose API
	// servers share a host name, and so one Lease.
	AssumeSeveral bool
	// APIServerAddresses names API servers (host:port) besides those in
	// default/kubernetes's EndpointSlices: each counts as one, and restow
	// reaches it there to read its own discovery (switch.go).
	APIServerAddresses []string
	// LagLimit is how long after the switch a first pass waits at most
	// for an API server that it reaches and that still stores at another
	// version; then the migration stops, Stalled. Zero means
	// DefaultLagLimit; it is never below LagBound.
	LagLimit time.Duration
	// Config, if set, is how restow reaches each API server at its own
	// address: its credentials and certificate authority, with the server
	// name of the kubernetes Service (switch.go). Without it, several API
	// servers are waited for by LagBound alone.
	Config *rest.Config
	// ReEncrypt names the resources restow re-encrypts after an encryption
	// key rotation (encryption.go): Resolve reads which encryption state
	// every API server loaded into Target.Encryption, and waits until they
	// agree.
	ReEncrypt []schema.GroupResource
	// Space says how passes learn etcd's room, which all of them share
	// (space.go, package quota).
	Space     SpaceOptions
	spaceOnce sync.Once
	budget    *quota.Budget
	// probes holds a discovery client per API server address, listers a
	// metadata client.
	probes, listers sync.Map
	// counted remembers the most API servers counted lately (lag.go).
	counted countMemory
	// crdClient watches the CRDs of migrations (history.go), made from
	// Config once.
	crdClientOnce sync.Once
	crdClient     apiextensionsclient.Interface
	crdClientErr  error
}

// NewForConfig builds a migrator on cfg whose reads are all uncached: c
// reads and writes CRDs, and metadata, discovery and a dynamic RESTMapper are
// made from cfg.
func NewForConfig(cfg *rest.Config, c client.Client) (*Migrator, error) {
	meta, objects, throttle, err := ThrottledClients(cfg)
	if err != nil {
		return nil, err
	}
	disco, err := clientdiscovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		return nil, err
	}
	return &Migrator{Client: c, Reader: c, Metadata: meta, Objects: objects, Discovery: disco, Mapper: mapper, Throttle: throttle, Config: cfg}, nil
}

// ThrottledClients returns the clients of a Migrator's object requests, on
// a connection of their own made from cfg, whose 429 answers the returned
// Throttle sees: a metadata client, and the client that lists whole objects
// and writes them back as listed (write.go).
func ThrottledClients(cfg *rest.Config) (metadata.Interface, rest.Interface, *pace.Throttle, error) {
	throttle := &pace.Throttle{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(throttle.Wrap)
	if cfg.RateLimiter == nil && cfg.QPS >= 0 {
		// One client-side limit for both clients, as for one.
		qps, burst := cfg.QPS, cfg.Burst
		if qps == 0 {
			qps = rest.DefaultQPS
		}
		if burst == 0 {
			burst = rest.DefaultBurst
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	meta, err := metadata.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, nil, nil, err
	}
	// As the metadata client's: paths are absolute, and errors decode.
	objCfg := metadata.ConfigFor(cfg)
	objCfg.GroupVersion = &schema.GroupVersion{}
	objCfg.APIPath = "/"
	objects, err := rest.RESTClientForConfigAndClient(objCfg, hc)
	if err != nil {
		return nil, nil, nil, err
	}
	return meta, objects, throttle, nil
}
