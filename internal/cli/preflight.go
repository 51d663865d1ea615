package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/preflight"

	"github.com/restow/restow/internal/verify"
)

// ExitBlocked is preflight's and prepare's exit code for a CRD whose apply
// the API server would refuse and that restow cannot prepare (a skipped
// release, a downgrade, or another refusal). A CRD that prepare can let
// through exits ExitPending.
const ExitBlocked = 8

// manifestFlags are the CRD manifests preflight and prepare read.
type manifestFlags struct {
	files     []string
	recursive bool
	keep      []string
	// trustWebhook vouches for a CRD's conversion webhook where a bridge
	// needs one: see fieldCheck.
	trustWebhook bool
}

func (o *manifestFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringSliceVarP(&o.files, "filename", "f", nil, "Manifests to check: a file, a directory, or - for standard input; repeat for several.")
	cmd.Flags().BoolVarP(&o.recursive, "recursive", "R", false, "Read the directories given with -f and their subdirectories.")
	cmd.Flags().StringArrayVar(&o.keep, "keep", nil, "CRD=VERSION[,VERSION...]: the versions a release keeps of a CRD, without its manifest (no dry run then); repeat for several.")
	cmd.Flags().BoolVar(&o.trustWebhook, "trust-conversion-webhook", false, "Where a skipped release or a downgrade needs a new storage version and the CRD's conversion is a webhook: bridge once a round trip through the webhook keeps every field of every object stored now, vouching that it also converts objects written while the storage version switches, which restow cannot check.")
}

type preflightOptions struct {
	manifestFlags
	output string
	// etcd, when --etcd-endpoints is given, is read for the objects stored
	// at each version a manifest drops.
	etcd     etcdFlags
	readEtcd bool
}

// preflightLong is the help of preflight.
var preflightLong = fmt.Sprintf(`preflight reads CRD manifests (files, directories with -R, or - for standard
input: the output of helm template --include-crds or kustomize build; other
documents are left out) and holds each CRD against the live one. The API
server refuses a CRD that drops a version status.storedVersions still lists
("missing from spec.versions" since Kubernetes 1.33, "must appear in
spec.versions" before). For each CRD it says, on one line:

  ok             the apply keeps every stored version
  needs prepare  it drops stored versions: kubectl restow prepare migrates
                 every object to the live storage version, or, where the
                 manifest drops that too (a skipped release, a
                 downgrade), to a version both sides serve that keeps
                 every field of every object (checked object by object),
                 and prunes status.storedVersions; then the apply passes
  blocked        it drops the live storage version and no version both
                 sides serve keeps every field (the objects and fields are
                 named), its conversion webhook is not vouched for
                 (--trust-conversion-webhook), or the API server refuses
                 it for another reason
  new            the cluster has no such CRD

A CRD that is ok but whose status.storedVersions would still list versions
besides its storage version after the apply gets a warning: a later release
that drops one is refused (kubectl restow prepare --ahead, or the operator,
migrates it first).

A server-side dry run of each CRD (dryRun=All) confirms the verdict. Given
--etcd-endpoints (and verify's other etcd flags), it also reads etcd and says
how many objects are stored at each version of a CRD whose manifest drops
one, or that such a warning names; a read that does not hold every object the API lists exits %d.
preflight writes nothing. It exits 0 when every CRD is ok or new, %d when
one needs prepare, %d when one is blocked, 1 on an error.`, ExitUnaccounted, ExitPending, ExitBlocked)

func newPreflightCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	opts := preflightOptions{}
	cmd := &cobra.Command{
		Use:   "preflight -f FILE|DIR|- [-f ...] | --keep CRD=VERSION[,VERSION...]",
		Short: "Say whether the API server would refuse a CRD upgrade, before it is applied",
		Long:  preflightLong,
		Example: `  helm template my-release my-chart --include-crds | kubectl restow preflight -f -
  kubectl restow preflight -f config/crd/ -R
  kubectl restow preflight --keep crontabs.stable.example.com=v1`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("preflight takes no arguments, got %q: give manifests with -f, or versions with --keep", args)
			}
			manifests, err := opts.manifests(streams.In)
			if err != nil {
				return err
			}
			if err := validateOutput(opts.output); err != nil {
				return err
			}
			c, err := f.clients(cmd.Context())
			if err != nil {
				return err
			}
			var etcd verify.Reader
			if opts.readEtcd = cmd.Flags().Changed("etcd-endpoints"); opts.readEtcd {
				if err := opts.etcd.validate(); err != nil {
					return err
				}
				client, err := opts.etcd.open(cmd.Context())
				if err != nil {
					return err
				}
				defer func() { _ = client.Close() }()
				etcd = client.KV
			}
			return runPreflight(cmd.Context(), c, streams.Out, manifests, opts.output, etcdRead{etcd, opts.etcd.scan}, opts.trustWebhook)
		},
	}
	opts.add(cmd)
	addOutputFlag(cmd, &opts.output)
	opts.etcd.add(cmd.Flags())
	return cmd
}

// manifests reads -f and --keep, and refuses a check of nothing.
func (o manifestFlags) manifests(in io.Reader) ([]preflight.Manifest, error) {
	if len(o.files) == 0 && len(o.keep) == 0 {
		return nil, errors.New("preflight needs manifests (-f FILE, DIR or -) or versions (--keep CRD=VERSION[,VERSION...])")
	}
	manifests, err := preflight.Read(o.files, o.recursive, in)
	if err != nil {
		return nil, err
	}
	for _, k := range o.keep {
		m, err := preflight.ParseKeep(k)
		if err != nil {
			return nil, err
		}
		manifests = append(manifests, m)
	}
	if len(manifests) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition (apiextensions.k8s.io/v1) in %v: nothing to check", o.files)
	}
	return manifests, nil
}

type preflightOutput struct {
	CRDs []preflight.Verdict `json:"crds"`
}

// etcdRead is the etcd preflight reads, if any, and how.
type etcdRead struct {
	reader verify.Reader
	scan   verify.ScanOptions
}

func runPreflight(ctx context.Context, c *clients, w io.Writer, manifests []preflight.Manifest, output string, etcd etcdRead, trustWebhook bool) error {
	out := preflightOutput{}
	worst := preflight.OK
	p := &preflight.Preparer{Client: c.client, TrustWebhook: trustWebhook}
	for _, m := range manifests {
		v, err := p.Check(ctx, m)
		if err != nil {
			return err
		}
		if etcd.reader != nil && (len(v.Drops) > 0 || len(v.Ahead) > 0) {
			if v.Etcd, err = c.storedInEtcd(ctx, etcd, m.Name); err != nil {
				return err
			}
		}
		out.CRDs = append(out.CRDs, v)
		if v.State.Weight() > worst.Weight() {
			worst = v.State
		}
	}
	if output != "" {
		if err := printStructured(w, output, out); err != nil {
			return err
		}
	} else {
		for _, v := range out.CRDs {
			fmt.Fprintf(w, "%s: %s: %s\n", v.CRD, v.State, v.Reason)
			if v.DryRun != "" {
				fmt.Fprintf(w, "  server-side dry run: %s\n", v.DryRun)
			}
			if v.Etcd != nil {
				fmt.Fprintf(w, "  etcd holds %s\n", v.Etcd)
			}
			for _, warning := range v.Warnings {
				fmt.Fprintf(w, "  warning: %s\n", warning)
			}
		}
	}
	switch worst {
	case preflight.Blocked:
		return &exitError{code: ExitBlocked, err: errors.New("the API server would refuse a CRD that restow cannot prepare: see blocked above")}
	case preflight.NeedsPrepare:
		return &exitError{code: ExitPending, err: errors.New("the API server would refuse a CRD until kubectl restow prepare migrates it: see needs prepare above")}
	}
	return nil
}

// storedInEtcd counts the objects of CRD name by the version etcd holds
// them at, held against the API's count at the same revision as verify
// holds it: a read that does not hold every object the API lists proves
// nothing, and ends preflight with ExitUnaccounted.
func (c *clients) storedInEtcd(ctx context.Context, etcd etcdRead, name string) (*preflight.Stored, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return nil, fmt.Errorf("reading CRD %s: %w", name, err)
	}
	gr := schema.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}
	api := verify.APIView{Group: gr.Group, Kind: crd.Spec.Names.Kind, CRD: crdView(crd)}
	listed, err := c.discoverStorage(gr, &api)
	if err != nil {
		return nil, err
	}
	scan := etcd.scan
	scan.APICount = c.apiCount(listed)
	report, err := verify.Scan(ctx, etcd.reader, gr, true, scan)
	if err != nil {
		return nil, fmt.Errorf("reading %s in etcd: %w", gr, err)
	}
	j := verify.Judge(report, api, verify.Expectations{})
	if j.Unaccounted() {
		return nil, &exitError{code: ExitUnaccounted, err: fmt.Errorf("etcd's read of %s does not hold every object the API lists, so it proves nothing: %s", gr, findingsOf(j, verify.Unaccounted))}
	}
	stored := &preflight.Stored{Revision: report.Revision, Versions: map[string]int{}}
	for label, count := range report.Versions {
		stored.Versions[strings.TrimPrefix(label, gr.Group+"/")] = count.Objects
	}
	return stored, nil
}

// findingsOf joins the messages of j's findings of severity s.
func findingsOf(j verify.Judgement, s verify.Severity) string {
	var out []string
	for _, f := range j.Findings {
		if f.Severity == s {
			out = append(out, f.Message)
		}
	}
	return strings.Join(out, "; ")
}
