package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/verify"
)

// verify's exit codes, beyond 0 and 1. When several hold, the highest is
// given: a read that did not see every object proves nothing else.
const (
	// ExitMismatch: etcd holds objects that --expect-version or
	// --expect-key do not allow.
	ExitMismatch = 5
	// ExitDanger: a danger verdict, with or without --expect-*: acting on
	// what the API says would lose objects.
	ExitDanger = 6
	// ExitUnaccounted: etcd's read does not hold every object the API
	// lists (a wrong --etcd-prefix, another etcd, a key layout verify does
	// not know), or the prefix holds no key at all.
	ExitUnaccounted = 7
)

type verifyOptions struct {
	all       bool
	output    string
	expect    verify.Expectations
	expectKey string
	etcdFlags
}

// verifyLong is the help of verify.
var verifyLong = fmt.Sprintf(`verify reads etcd directly, read-only, and counts the objects of each resource
by the API version they are stored at (the stored value's own header: JSON or
CBOR apiVersion, the protobuf envelope) and by the encryption key they are
stored under (the k8s:enc: prefix, and a KMS v2 envelope's key ID). Beside it,
it shows what the API says (a CRD's status.storedVersions and storage
version, a built-in resource's storageVersionHash) and a verdict: whether a
CRD version is safe to remove. It never prints or keeps an object's contents,
only names (--names) and counts.

It needs the etcd client flags etcdctl takes: run it on a control-plane node,
where the API server's etcd client certificate is. Those certificates give
full access to the cluster: never copy them elsewhere.

Every count is held against the API's count of the same resource at the
same etcd revision: a read that finds fewer objects than the API lists (a
wrong --etcd-prefix, a resource kept in another etcd) proves nothing and
exits %d; a danger verdict exits %d.

With --expect-version or --expect-key it is a gate: it exits %d if any object
is stored otherwise (or cannot be read), 0 if all match, 1 on an error.`, ExitUnaccounted, ExitDanger, ExitMismatch)

func newVerifyCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	opts := verifyOptions{}
	cmd := &cobra.Command{
		Use:   "verify RESOURCE... | --all",
		Short: "Read etcd: at which version and under which key each object is stored",
		Long:  verifyLong,
		Example: `  # On a control-plane node of a kubeadm cluster:
  kubectl restow verify crontabs.stable.example.com \
    --etcd-endpoints https://127.0.0.1:2379 --etcd-cacert /etc/kubernetes/pki/etcd/ca.crt \
    --etcd-cert /etc/kubernetes/pki/apiserver-etcd-client.crt --etcd-key /etc/kubernetes/pki/apiserver-etcd-client.key
  # A gate: every Secret under the new key
  kubectl restow verify secrets --expect-key aescbc:key2 ...`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := opts.validate(args); err != nil {
				return err
			}
			key, err := verify.ParseKey(opts.expectKey)
			if err != nil {
				return err
			}
			opts.expect.Key = key
			c, err := f.clients(cmd.Context())
			if err != nil {
				return err
			}
			etcd, err := opts.open(cmd.Context())
			if err != nil {
				return err
			}
			defer func() { _ = etcd.Close() }()
			return runVerify(cmd.Context(), c, etcd.KV, streams, args, opts)
		},
	}
	flags := cmd.Flags()
	flags.BoolVar(&opts.all, "all", false, "Verify every resource that etcd stores: custom resources and built-in ones that can be listed and updated.")
	flags.StringVar(&opts.expect.Version, "expect-version", "", "Exit "+fmt.Sprint(ExitMismatch)+" unless every object is stored at this version (v1, or group/v1).")
	flags.StringVar(&opts.expectKey, "expect-key", "", "Exit "+fmt.Sprint(ExitMismatch)+" unless every object is stored under this key: identity (not encrypted), a provider and a key's name from the encryption configuration (aescbc:key2; for KMS, kms:<name> or kmsv2:<name>), or a KMS v2 key ID.")
	flags.IntVar(&opts.scan.Names, "names", verify.DefaultNames, "How many object names to show per count (0: none).")
	flags.Float64Var(&opts.scan.Rate, "rate", 0, "Most objects read from etcd per second (0: no limit), so that a busy etcd is not starved.")
	flags.Int64Var(&opts.scan.PageSize, "page-size", verify.DefaultPageSize, fmt.Sprintf("Most values read from etcd per request; never more than %d MiB divided by --etcd-max-request-bytes.", verify.MaxPageBytes>>20))
	opts.add(flags)
	addOutputFlag(cmd, &opts.output)
	return cmd
}

func (o verifyOptions) validate(args []string) error {
	switch {
	case o.all && len(args) > 0:
		return errors.New("verify takes RESOURCE arguments or --all, not both")
	case !o.all && len(args) == 0:
		return errors.New("verify needs a RESOURCE (such as crontabs.stable.example.com or secrets) or --all")
	case slices.ContainsFunc(args, func(a string) bool { return strings.TrimSpace(a) == "" }):
		return errors.New("a RESOURCE argument is empty")
	}
	if err := o.etcdFlags.validate(); err != nil {
		return err
	}
	if err := between("page-size", o.scan.PageSize, 1, maxPageSize); err != nil {
		return err
	}
	if o.scan.Names < 0 {
		return fmt.Errorf("--names must be 0 (none) or more, got %d", o.scan.Names)
	}
	if o.scan.Rate < 0 || math.IsNaN(o.scan.Rate) || math.IsInf(o.scan.Rate, 0) {
		return fmt.Errorf("--rate must be 0 (no limit) or a positive number of objects per second, got %v", o.scan.Rate)
	}
	return validateOutput(o.output)
}

// verifyTarget is one resource to verify, with what the API says of it.
type verifyTarget struct {
	gr  schema.GroupResource
	api verify.APIView
	// listed is the version the API's count lists the resource at.
	listed schema.GroupVersionKind
	// skip says why etcd is not read for it.
	skip string
}

// verifiedResource is one resource's part of verify's output.
type verifiedResource struct {
	Resource   string           `json:"resource"`
	Skipped    string           `json:"skipped,omitempty"`
	Etcd       *verify.Report   `json:"etcd,omitempty"`
	API        verify.APIView   `json:"api"`
	Findings   []verify.Finding `json:"findings,omitempty"`
	Mismatches []string         `json:"mismatches,omitempty"`
}

type verifyOutput struct {
	Resources []verifiedResource `json:"resources"`
	// LeftOut are the group versions --all did not read: served by an
	// aggregated API server whose discovery failed.
	LeftOut []leftOut `json:"leftOut,omitempty"`
	// Expect and Match are set for a gate.
	Expect *verifyExpect `json:"expect,omitempty"`
	Match  *bool         `json:"match,omitempty"`
}

type verifyExpect struct {
	Version string `json:"version,omitempty"`
	Key     string `json:"key,omitempty"`
}

func runVerify(ctx context.Context, c *clients, etcd verify.Reader, streams genericiooptions.IOStreams, args []string, opts verifyOptions) error {
	targets, left, err := verifyTargets(ctx, c, args, opts.all)
	if err != nil {
		return err
	}
	opts.scan.ExpectKey = opts.expect.Key
	out := verifyOutput{LeftOut: left}
	gate := opts.expect.Version != "" || opts.expect.Key.Given != ""
	match, danger, unaccounted := true, false, false
	var refused []string
	for _, t := range targets {
		res := verifiedResource{Resource: t.gr.String(), API: t.api, Skipped: t.skip}
		if t.skip == "" {
			scan := opts.scan
			scan.APICount = c.apiCount(t.listed)
			report, err := verify.Scan(ctx, etcd, t.gr, t.api.CRD != nil, scan)
			if err != nil {
				return err
			}
			j := verify.Judge(report, t.api, opts.expect)
			res.Etcd, res.Findings, res.Mismatches = report, j.Findings, j.Mismatches
			match = match && len(j.Mismatches) == 0
			danger = danger || j.Failed()
			unaccounted = unaccounted || j.Unaccounted()
			if j.Refused != "" {
				refused = append(refused, j.Refused)
			}
		}
		out.Resources = append(out.Resources, res)
	}
	if gate {
		out.Expect = &verifyExpect{Version: opts.expect.Version, Key: opts.expect.Key.Given}
		out.Match = &match
	}
	if opts.output != "" {
		if err := printStructured(streams.Out, opts.output, out); err != nil {
			return err
		}
	} else {
		printVerify(streams.Out, out)
	}
	switch {
	case unaccounted:
		return &exitError{code: ExitUnaccounted, err: errors.New("etcd's read does not hold every object the API lists: nothing is proven; check --etcd-prefix and --etcd-endpoints")}
	case danger:
		return &exitError{code: ExitDanger, err: errors.New("danger: acting on what the API says would lose objects")}
	case len(refused) > 0:
		return errors.New(refused[0])
	case gate && !match:
		return &exitError{code: ExitMismatch, err: fmt.Errorf("etcd holds objects that %s does not allow", expectation(opts.expect))}
	}
	return nil
}

// tooLargeResourceVersion is the watch cache's answer to a revision it has
// not seen yet.
func tooLargeResourceVersion(err error) bool {
	return apierrors.IsTimeout(err) && apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}

// apiCount counts a resource's objects through the API at an etcd
// revision: a list of one object at exactly that revision, whose remaining
// item count is the rest. The watch cache may answer that the revision is
// not yet in its view; it catches up within seconds.
func (c *clients) apiCount(gvk schema.GroupVersionKind) func(context.Context, int64) (verify.APIListing, error) {
	return func(ctx context.Context, revision int64) (verify.APIListing, error) {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		opts := &client.ListOptions{Limit: 1}
		if revision > 0 {
			opts.Raw = &metav1.ListOptions{ResourceVersion: strconv.FormatInt(revision, 10), ResourceVersionMatch: metav1.ResourceVersionMatchExact}
		}
		err := retry.OnError(retry.DefaultBackoff, tooLargeResourceVersion, func() error {
			return c.client.List(ctx, list, opts)
		})
		switch {
		case tooLargeResourceVersion(err) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			return verify.APIListing{}, fmt.Errorf("%w: listing %s at revision %d: %s", verify.ErrRevisionNotInAPI, gvk.GroupVersion(), revision, apierrors.ReasonForError(err))
		case err != nil:
			return verify.APIListing{}, fmt.Errorf("listing %s: %w", gvk.GroupVersion(), err)
		}
		listing := verify.APIListing{Count: int64(len(list.Items))}
		if len(list.Items) > 0 {
			first := list.Items[0]
			listing.First = first.Name
			if first.Namespace != "" {
				listing.First = first.Namespace + "/" + first.Name
			}
			if listing.FirstRevision, err = strconv.ParseInt(first.ResourceVersion, 10, 64); err != nil {
				return verify.APIListing{}, fmt.Errorf("listing %s: %s has resourceVersion %q, not an etcd revision", gvk.GroupVersion(), listing.First, first.ResourceVersion)
			}
		}
		if list.RemainingItemCount != nil {
			listing.Count += *list.RemainingItemCount
		} else if list.Continue != "" {
			return verify.APIListing{}, fmt.Errorf("%w: listing %s gave no remainingItemCount", verify.ErrNoAPICount, gvk.GroupVersion())
		}
		return listing, nil
	}
}

func expectation(e verify.Expectations) string {
	var parts []string
	if e.Version != "" {
		parts = append(parts, "--expect-version "+e.Version)
	}
	if e.Key.Given != "" {
		parts = append(parts, "--expect-key "+e.Key.Given)
	}
	return strings.Join(parts, " and ")
}

// verifyTargets resolves the arguments, or with --all every resource that
// discovery shows can be listed and updated (and the group versions left
// out: verifyresources.go), and reads what the API says of each.
func verifyTargets(ctx context.Context, c *clients, args []string, all bool) ([]verifyTarget, []leftOut, error) {
	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	if err := c.client.List(ctx, crds); err != nil {
		return nil, nil, fmt.Errorf("listing CRDs: %w", err)
	}
	byResource := map[schema.GroupResource]*apiextensionsv1.CustomResourceDefinition{}
	for i := range crds.Items {
		crd := &crds.Items[i]
		byResource[schema.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}] = crd
	}
	aggregated, err := aggregatedGroups(ctx, c.client)
	if err != nil {
		return nil, nil, err
	}
	var grs []schema.GroupResource
	var left []leftOut
	if all {
		if grs, left, err = storedResources(c, aggregated); err != nil {
			return nil, nil, err
		}
		if err := unlistedCRDs(slices.Collect(maps.Keys(byResource)), grs); err != nil {
			return nil, nil, err
		}
	} else {
		for _, arg := range args {
			gr, err := c.resolveResource(arg)
			if err != nil {
				return nil, nil, err
			}
			grs = append(grs, gr)
		}
	}
	targets := make([]verifyTarget, 0, len(grs))
	for _, gr := range grs {
		t := verifyTarget{gr: gr, api: verify.APIView{Group: gr.Group}}
		if crd := byResource[gr]; crd != nil {
			t.api.Kind = crd.Spec.Names.Kind
			t.api.CRD = crdView(crd)
		} else if aggregated.groups[gr.Group] {
			t.skip = "served by an aggregated API server: not stored in this etcd"
		}
		if t.skip == "" {
			listed, err := c.discoverStorage(gr, &t.api)
			if err != nil {
				return nil, nil, err
			}
			t.listed = listed
		}
		targets = append(targets, t)
	}
	return targets, left, nil
}

func crdView(crd *apiextensionsv1.CustomResourceDefinition) *verify.CRDView {
	v := &verify.CRDView{Name: crd.Name, StoredVersions: crd.Status.StoredVersions}
	for _, version := range crd.Spec.Versions {
		v.Versions = append(v.Versions, version.Name)
		if version.Storage {
			v.StorageVersion = version.Name
		}
	}
	return v
}

// discoverStorage fills in the resource's kind and storageVersionHash from
// the discovery of its preferred version, which it returns.
func (c *clients) discoverStorage(gr schema.GroupResource, api *verify.APIView) (schema.GroupVersionKind, error) {
	mapping, err := c.mapper.RESTMapping(schema.GroupKind{Group: gr.Group, Kind: api.Kind})
	if api.Kind == "" || err != nil {
		gvk, kerr := c.mapper.KindFor(gr.WithVersion(""))
		if kerr != nil {
			return schema.GroupVersionKind{}, fmt.Errorf("the kind of %s: %w", gr, kerr)
		}
		api.Kind = gvk.Kind
		if mapping, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return schema.GroupVersionKind{}, err
		}
	}
	resources, err := c.migrator.Discovery.ServerResourcesForGroupVersion(mapping.Resource.GroupVersion().String())
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("discovery of %s: %w", mapping.Resource.GroupVersion(), err)
	}
	for _, r := range resources.APIResources {
		if r.Name == gr.Resource {
			api.StorageVersionHash = r.StorageVersionHash
		}
	}
	return mapping.GroupVersionKind, nil
}

// printVerify prints one block per resource: what etcd holds, what the API
// says, and the verdict.
func printVerify(w io.Writer, out verifyOutput) {
	for i, r := range out.Resources {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if r.Skipped != "" {
			fmt.Fprintf(w, "%s: skipped: %s\n", r.Resource, r.Skipped)
			continue
		}
		rep := r.Etcd
		snapshot := fmt.Sprintf("revision %d", rep.Revision)
		if !rep.Snapshot {
			snapshot = fmt.Sprintf("from revision %d on: etcd compacted it during the read", rep.Revision)
		}
		fmt.Fprintf(w, "%s: %d objects in etcd under %s (%s)\n", r.Resource, rep.Objects, rep.KeyPrefix, snapshot)
		if rep.Objects > 0 {
			fmt.Fprintf(w, "  stored at:    %s\n", countsLine(rep.Versions, rep.VersionsSorted()))
			fmt.Fprintf(w, "  stored under: %s\n", countsLine(rep.Keys, rep.KeysSorted()))
		}
		if crd := r.API.CRD; crd != nil {
			fmt.Fprintf(w, "  CRD %s: storage version %s, status.storedVersions [%s]\n", crd.Name, crd.StorageVersion, strings.Join(crd.StoredVersions, " "))
		} else if r.API.StorageVersionHash != "" {
			fmt.Fprintf(w, "  API: storageVersionHash %s\n", r.API.StorageVersionHash)
		}
		for _, f := range r.Findings {
			fmt.Fprintf(w, "  %s: %s\n", f.Severity, f.Message)
		}
		for _, m := range r.Mismatches {
			fmt.Fprintf(w, "  MISMATCH: %s\n", m)
		}
	}
	for _, l := range out.LeftOut {
		fmt.Fprintf(w, "\n%s: left out: %s\n", l.GroupVersion, l.Reason)
	}
	if out.Match != nil {
		verdict := "every object matches"
		if !*out.Match {
			verdict = "MISMATCH"
		}
		fmt.Fprintf(w, "\n%s: %s\n", expectation(verify.Expectations{Version: out.Expect.Version, Key: verify.KeyWant{Given: out.Expect.Key}}), verdict)
	}
}

func countsLine(counts map[string]*verify.Count, labels []string) string {
	parts := make([]string, 0, len(labels))
	for _, l := range labels {
		parts = append(parts, fmt.Sprintf("%s %d", l, counts[l].Objects))
	}
	return strings.Join(parts, ", ")
}
