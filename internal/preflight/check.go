package preflight

import (
	"context"
	"fmt"
	"slices"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// The plan, and the re-check after the migration: the live CRD read, the
// manifest judged against it, the field check where a bridge is needed
// (fields.go), and the API server's own word, a server-side dry run.

// Check judges one manifest against the live CRD, checks the fields of
// its objects where the apply needs a bridge or a conversion webhook, and
// confirms the verdict with a server-side dry run of the manifest's spec.
// It writes nothing.
func (p *Preparer) Check(ctx context.Context, m Manifest) (Verdict, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	err := p.Client.Get(ctx, client.ObjectKey{Name: m.Name}, crd)
	switch {
	case apierrors.IsNotFound(err):
		return Judge(m, nil), nil
	case err != nil:
		return Verdict{}, fmt.Errorf("reading CRD %s: %w", m.Name, err)
	}
	live := LiveOf(crd)
	live.Migrated, err = p.lastPassAt(ctx, crd, live.Storage)
	if err != nil {
		return Verdict{}, err
	}
	v := Judge(m, &live)
	v.CheckedResourceVersion = crd.ResourceVersion
	switch {
	case v.Bridge != "":
		err = p.fieldCheck(ctx, crd, m.CRD, &v)
	case v.State == NeedsPrepare && viaWebhook(crd):
		err = p.webhookCheck(ctx, crd, &v)
	case p.Ahead && v.AheadNow && viaWebhook(crd):
		err = p.aheadCheck(ctx, crd, &v)
	}
	if err != nil {
		return Verdict{}, err
	}
	if m.CRD == nil {
		return v, nil
	}
	refused, err := p.dryRunApply(ctx, crd, m.CRD)
	switch {
	case err != nil:
		return Verdict{}, err
	case refused == "":
		v.DryRun = "accepted"
	default:
		v.DryRun = "refused: " + refused
		if v.State == OK {
			v.State, v.Reason = Blocked, "the API server refuses the CRD for a reason other than its stored versions: "+refused
		}
	}
	return v, nil
}

// dryRunApply sends the manifest's spec as an update of the live CRD with
// dryRun=All: the API server validates it as it would the apply, stores
// nothing, and says why it refuses it ("" when it accepts it).
func (p *Preparer) dryRunApply(ctx context.Context, live, manifest *apiextensionsv1.CustomResourceDefinition) (string, error) {
	updated := live.DeepCopy()
	updated.Spec = *manifest.Spec.DeepCopy()
	err := p.Client.Update(ctx, updated, client.DryRunAll)
	switch {
	case err == nil:
		return "", nil
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return err.Error(), nil
	}
	// A 403 may be RBAC (the dry run needs update on the CRD) or an
	// admission webhook: not a verdict either way.
	return "", fmt.Errorf("dry run of CRD %s: %w", manifest.Name, err)
}

// lastPassAt says what restow's StorageMigrations record of a pass that
// rewrote every object of crd's resource at version, or "".
func (p *Preparer) lastPassAt(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, version string) (string, error) {
	var list migrationv1alpha1.StorageMigrationList
	err := p.Client.List(ctx, &list)
	if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		// restow's CRD not installed, or not readable: no record.
		return "", nil
	}
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(list.Items, func(sm migrationv1alpha1.StorageMigration) bool {
		res, last := sm.Spec.Resource, sm.Status.LastPass
		return res.Group == crd.Spec.Group && res.Resource == crd.Spec.Names.Plural &&
			last != nil && last.TargetVersion == version && last.Failed == 0
	})
	if i < 0 {
		return "", nil
	}
	sm := list.Items[i]
	return fmt.Sprintf("restow's StorageMigration %s rewrote all %d objects to %s at %s", sm.Name, sm.Status.LastPass.Listed, version, sm.Status.LastPass.CompletionTime.UTC().Format("2006-01-02T15:04:05Z")), nil
}
