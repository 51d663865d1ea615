package preflight

import (
	"context"
	"fmt"
	"slices"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsac "k8s.io/apiextensions-apiserver/pkg/client/applyconfiguration/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// The switch: the bridge made the live storage version (toBridge), checked
// again for a conversion webhook (recheck) and moved back on a loss
// (moveBack); how a storage version is written (switchStorage, as the field
// manager that owns spec.versions); and, after a migration failed, whether
// another writer moved it (flippedBack).

// flippedBack says, after a migration to version failed, whether the CRD's
// storage version moved away from it meanwhile (an owner re-applying the
// old CRD: an operator that manages its CRDs, a GitOps self-heal), and
// who wrote it; nil if it did not.
func (p *Preparer) flippedBack(ctx context.Context, name, version string) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := p.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return fmt.Errorf("reading CRD %s again to see whether its storage version moved: %w", name, err)
	}
	live := LiveOf(crd)
	if live.Storage == version {
		return nil
	}
	// spec.versions is an atomic list: whoever wrote it last owns it.
	writer, _ := versionsOwner(crd)
	return fmt.Errorf("the storage version of CRD %s went from %s to %s while prepare migrated (spec.versions is now field manager %s's): nothing was pruned. Something re-applies the old CRD (an operator that manages its own CRDs, a GitOps self-heal): pause it, then run prepare again", name, version, live.Storage, writer)
}

// toBridge makes v.Bridge the live storage version of CRD name, onto the
// CRD that was checked only, and, for a conversion webhook, checks the
// round trip again (recheck); it returns the state prepare ends in when it
// fails.
func (p *Preparer) toBridge(ctx context.Context, name string, v Verdict) (State, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := p.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return v.State, err
	}
	if crd.ResourceVersion != v.CheckedResourceVersion {
		return v.State, fmt.Errorf("CRD %s changed since prepare checked its objects' fields: nothing was changed; run prepare again", name)
	}
	manager, err := p.switchStorage(ctx, crd, v.Bridge)
	if err != nil {
		return v.State, err
	}
	p.Report.Did(v.CRD, fmt.Sprintf("made %s the live storage version in place of %s (as field manager %s, which owns spec.versions), after checking that no object loses a field at it", v.Bridge, v.Storage, manager))
	if viaWebhook(crd) {
		if err := p.recheck(ctx, name, v); err != nil {
			return Blocked, err
		}
	}
	return v.State, nil
}

// recheck runs the round trip through the conversion webhook again right
// after the storage switch, for objects written at the old storage version
// between the first check and the switch; if one would lose a field, or
// the webhook fails, it moves the storage version back to v.Storage and
// stops, before this process migrates anything and with nothing pruned.
// (Writes that reach the old storage later, through an API server that has
// not switched yet, are what --trust-conversion-webhook vouches for.)
func (p *Preparer) recheck(ctx context.Context, name string, v Verdict) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := p.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return p.moveBack(ctx, name, v, fmt.Sprintf("reading the CRD after the switch failed: %v", err))
	}
	stored := slices.DeleteFunc(storedAt(crd), func(s string) bool { return s == v.Bridge })
	trip, err := p.roundTrip(ctx, crd, stored, v.Bridge)
	if err != nil {
		return p.moveBack(ctx, name, v, fmt.Sprintf("the check after the switch failed: %v", err))
	}
	if losses := trip.all(); len(losses) > 0 {
		return p.moveBack(ctx, name, v, fmt.Sprintf("after the switch, %s written at %s meanwhile would lose fields at %s or could not be converted there: %s",
			objectCount(len(losses)), v.Storage, v.Bridge, nameLosses(losses)))
	}
	return nil
}

// moveBack makes v.Storage the storage version of CRD name again, after a
// failed recheck said why, and returns the error prepare ends with. It
// does so even when ctx has ended (an interrupt, --timeout), within a
// bound of its own, on the CRD as it is then.
func (p *Preparer) moveBack(ctx context.Context, name string, v Verdict, why string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moveBackTimeout)
	defer cancel()
	now := v.Bridge
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := p.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		if now = LiveOf(crd).Storage; now != v.Bridge {
			return nil
		}
		_, err := p.switchStorage(ctx, crd, v.Storage)
		return err
	})
	back := fmt.Sprintf("moved the storage version back to %s", v.Storage)
	switch {
	case err == nil && now != v.Bridge:
		back = fmt.Sprintf("the storage version was already %s, moved by another client, and is left so", now)
	case err != nil:
		back = fmt.Sprintf("could not move the storage version back to %s (%v): apply the installed release again", v.Storage, err)
	}
	return &stopped{ErrBlocked, fmt.Errorf("%s; %s, and nothing was pruned", why, back)}
}

// moveBackTimeout bounds moveBack.
const moveBackTimeout = 30 * time.Second

// switchStorage makes version the storage version of the live CRD, as the
// field manager that owns spec.versions, so that the user's next apply (a
// server-side apply by Helm 4 or kubectl, or a client-side one) meets no
// conflict: an Apply owner's fields are applied again as they are, with
// the storage flags moved; an Update owner's write is an update under its
// name. It returns the manager it wrote as.
func (p *Preparer) switchStorage(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, version string) (string, error) {
	owner, op := versionsOwner(crd)
	if op == metav1.ManagedFieldsOperationApply {
		ac, err := apiextensionsac.ExtractCustomResourceDefinition(crd, owner)
		if err != nil {
			return "", fmt.Errorf("reading what %s applied to CRD %s: %w", owner, crd.Name, err)
		}
		if ac.Spec == nil || len(ac.Spec.Versions) == 0 {
			return "", fmt.Errorf("field manager %s owns spec.versions of CRD %s but applied none", owner, crd.Name)
		}
		for i := range ac.Spec.Versions {
			ac.Spec.Versions[i].Storage = ptr.To(ptr.Deref(ac.Spec.Versions[i].Name, "") == version)
		}
		// Only onto the CRD that was checked: a conflict if it changed.
		ac.WithResourceVersion(crd.ResourceVersion)
		// The name is the field manager's own: no conflict with itself.
		if err := p.Client.Apply(ctx, ac, client.FieldOwner(owner), client.ForceOwnership); err != nil {
			return "", fmt.Errorf("making %s the storage version of CRD %s as field manager %s: %w%s", version, crd.Name, owner, err, grantSpecWrite(err, crd.Name))
		}
		return owner, nil
	}
	updated := crd.DeepCopy()
	for i := range updated.Spec.Versions {
		updated.Spec.Versions[i].Storage = updated.Spec.Versions[i].Name == version
	}
	if err := p.Client.Update(ctx, updated, client.FieldOwner(owner)); err != nil {
		return "", fmt.Errorf("making %s the storage version of CRD %s: %w%s", version, crd.Name, err, grantSpecWrite(err, crd.Name))
	}
	return owner, nil
}

// versionsOwner is the field manager that owns spec.versions of crd (the
// latest, if several do) and how it wrote it; kubectl-restow with Update
// when none does.
func versionsOwner(crd *apiextensionsv1.CustomResourceDefinition) (string, metav1.ManagedFieldsOperationType) {
	path := fieldpath.MakePathOrDie("spec", "versions")
	owner, op := "kubectl-restow", metav1.ManagedFieldsOperationUpdate
	var latest *metav1.Time
	for _, e := range crd.ManagedFields {
		if e.Subresource != "" || e.FieldsV1 == nil {
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(e.FieldsV1.GetRawReader()); err != nil || !set.Has(path) {
			continue
		}
		if latest == nil || (e.Time != nil && latest.Before(e.Time)) {
			owner, op, latest = e.Manager, e.Operation, e.Time
			if latest == nil {
				latest = &metav1.Time{}
			}
		}
	}
	return owner, op
}

// grantSpecWrite says what a refused storage switch needs.
func grantSpecWrite(err error, name string) string {
	if !apierrors.IsForbidden(err) {
		return ""
	}
	return fmt.Sprintf(". Bridging a skipped release or a downgrade writes the CRD's spec: grant update and patch on customresourcedefinitions, resourceNames [%s], to this identity (nothing was changed)", name)
}
