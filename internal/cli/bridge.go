package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsac "k8s.io/apiextensions-apiserver/pkg/client/applyconfiguration/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/restow/restow/internal/preflight"
)

// shownLosses is how many objects a field check names.
const shownLosses = 10

// fieldCheck proves, before prepare writes anything, that no object of crd
// loses a field when it is stored at v.Bridge, and makes v blocked,
// naming the objects and fields (never their values), if any would: with
// conversion None, by comparing what the API server reads at each version
// (readLosses); with a webhook, by a round trip through it (roundTrip).
// Every version objects may be stored at must be served, or they cannot
// be read. A webhook is trusted with the objects written while the storage
// version switches only with trustWebhook (--trust-conversion-webhook): no
// check can see those.
func (c *clients) fieldCheck(ctx context.Context, crd, manifest *apiextensionsv1.CustomResourceDefinition, v *preflight.Verdict, trustWebhook bool) error {
	block := func(format string, args ...any) {
		v.State = preflight.Blocked
		v.Reason = fmt.Sprintf("the manifest drops %s, the live storage version; ", v.Storage) + fmt.Sprintf(format, args...)
	}
	stored := storedAt(crd)
	live := preflight.LiveOf(crd)
	if version, ok := unserved(live, stored); ok {
		block("objects may be stored at %s, which the live CRD does not serve, so restow cannot read them to prove that %s keeps every field: serve %s, or apply a release in between first", version, v.Bridge, version)
		return nil
	}
	versions := stored
	for _, s := range live.Served {
		versions = appendNew(versions, s)
	}
	var losses map[client.ObjectKey][]string
	if viaWebhook(crd) {
		trip, err := c.roundTrip(ctx, crd, stored, v.Bridge)
		if err != nil {
			return unchecked(v, err)
		}
		losses = trip.all()
		// Field names may differ between versions: only the bridge's own
		// schema, live and in the release, can be compared.
		versions = []string{v.Bridge}
	} else {
		var err error
		if losses, err = c.readLosses(ctx, crd, versions, v.Bridge); err != nil {
			return err
		}
	}
	if len(losses) > 0 {
		block("%s would lose fields or be refused at %s, the only version that could carry them across: %s. Nothing was changed. Apply a release that keeps %s, or move those fields out of the objects, first",
			objectCount(len(losses)), v.Bridge, nameLosses(losses), v.Storage)
		return nil
	}
	// No object sets such a field now, but one written with it before the
	// migration ends would lose it, and so would one the release's own
	// schema of the bridge drops after the apply: fail closed.
	loss := preflight.SchemaLoss(crd, versions, crd, v.Bridge)
	if manifest != nil {
		loss = append(loss, preflight.SchemaLoss(crd, versions, manifest, v.Bridge)...)
	}
	if len(loss) > 0 {
		block("no object sets a field %s lacks now, but the schemas allow fields it does not (%s): an object written with one before the migration ends, or read after the release's apply, would lose it. Nothing was changed. Apply a release that keeps %s first",
			v.Bridge, strings.Join(slices.Compact(loss), "; "), v.Storage)
		return nil
	}
	if viaWebhook(crd) {
		if !trustWebhook {
			block("its conversion is a webhook, and a round trip through it to %s and back kept every field of every object stored now; but an object written at %s while the storage version switches goes through the webhook unchecked, so restow bridges only with --trust-conversion-webhook, which vouches for the webhook. Nothing was changed", v.Bridge, v.Storage)
			return nil
		}
		v.Warnings = append(v.Warnings, fmt.Sprintf("the conversion webhook took every object stored now to %s and back without loss; prepare checks again right after it switches the storage version and moves it back on a loss, but objects written at %s after that are the webhook's to convert (--trust-conversion-webhook): pause their writers. The release's own webhook must convert from %s too", v.Bridge, v.Storage, v.Bridge))
	}
	owner, _ := versionsOwner(crd)
	v.Warnings = append(v.Warnings, fmt.Sprintf("prepare writes the storage version as field manager %s, which owns spec.versions; if %s re-applies this CRD during prepare (an operator that manages its own CRDs, a GitOps self-heal), it moves the storage version back and prepare stops, pruning nothing: pause it first", owner, owner))
	return nil
}

// webhookCheck proves, for a CRD whose conversion is a webhook and whose
// live storage version the manifest keeps, that migrating its objects
// there loses no field: a round trip from each other version objects may
// be stored at (as after a storage switch that prepare made, then
// interrupted, or that the release made). A field lost makes v blocked; an
// object the webhook refuses does not, since the migration cannot move it
// either and names it, pruning nothing.
func (c *clients) webhookCheck(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, v *preflight.Verdict) error {
	live := preflight.LiveOf(crd)
	stored := slices.DeleteFunc(storedAt(crd), func(s string) bool { return s == live.Storage })
	if _, ok := unserved(live, stored); ok {
		// Not readable: the migration's own reads convert them.
		return nil
	}
	trip, err := c.roundTrip(ctx, crd, stored, live.Storage)
	if err != nil {
		return unchecked(v, err)
	}
	if len(trip.lost) > 0 {
		v.State = preflight.Blocked
		v.Reason = fmt.Sprintf("its conversion webhook would lose fields of %s migrated to %s, the storage version: %s. Nothing was changed. Fix the webhook, or move those fields out of the objects, first",
			objectCount(len(trip.lost)), live.Storage, nameLosses(trip.lost))
	}
	return nil
}

// storedAt lists the versions crd's objects may be stored at:
// status.storedVersions and the storage version.
func storedAt(crd *apiextensionsv1.CustomResourceDefinition) []string {
	live := preflight.LiveOf(crd)
	return appendNew(slices.Clone(live.StoredVersions), live.Storage)
}

// unserved is the first of versions that live does not serve, if any.
func unserved(live preflight.Live, versions []string) (string, bool) {
	for _, version := range versions {
		if !slices.Contains(live.Served, version) {
			return version, true
		}
	}
	return "", false
}

// objectCount says "1 object" or "n objects".
func objectCount(n int) string {
	if n == 1 {
		return "1 object"
	}
	return fmt.Sprintf("%d objects", n)
}

// nameLosses names the first shownLosses objects of losses, in order, each
// with its fields.
func nameLosses(losses map[client.ObjectKey][]string) string {
	keys := make([]client.ObjectKey, 0, len(losses))
	for k := range losses {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b client.ObjectKey) int { return strings.Compare(a.String(), b.String()) })
	shown := keys[:min(len(keys), shownLosses)]
	named := make([]string, 0, len(shown))
	for _, k := range shown {
		named = append(named, fmt.Sprintf("%s (%s)", strings.TrimPrefix(k.String(), "/"), strings.Join(losses[k], ", ")))
	}
	return strings.Join(named, "; ")
}

// readLosses reads every object of crd at each of versions (the versions
// it may be stored at first) and at bridge: what the bridge does not
// return is lost (the API server prunes what a version's schema lacks,
// silently). Each object, as stored at the live storage version, is then
// sent to the bridge in a server-side dry run with strict field
// validation, which names fields the bridge's schema does not declare and
// refuses objects it would not accept. It returns, by object, the fields
// lost or refused.
func (c *clients) readLosses(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, versions []string, bridge string) (map[client.ObjectKey][]string, error) {
	storage := preflight.LiveOf(crd).Storage
	at := func(version string) (map[client.ObjectKey]*unstructured.Unstructured, error) {
		return c.listAll(ctx, schema.GroupVersionKind{Group: crd.Spec.Group, Version: version, Kind: crd.Spec.Names.Kind})
	}
	bridged, err := at(bridge)
	if err != nil {
		return nil, err
	}
	losses := map[client.ObjectKey][]string{}
	var atStorage map[client.ObjectKey]*unstructured.Unstructured
	for _, version := range versions {
		if version == bridge {
			continue
		}
		objs, err := at(version)
		if err != nil {
			return nil, err
		}
		if version == storage {
			atStorage = objs
		}
		for key, o := range objs {
			b, ok := bridged[key]
			if !ok {
				// Not in the bridge's list: read it there by itself. Gone
				// is gone (deleted between the lists); anything else is
				// compared as any other.
				b = &unstructured.Unstructured{}
				b.SetGroupVersionKind(schema.GroupVersionKind{Group: crd.Spec.Group, Version: bridge, Kind: crd.Spec.Names.Kind})
				if err := c.client.Get(ctx, key, b); apierrors.IsNotFound(err) {
					continue
				} else if err != nil {
					return nil, fmt.Errorf("reading %s at %s: %w", key, bridge, err)
				}
			}
			if missing := preflight.Missing(preflight.FieldPaths(o.Object), preflight.FieldPaths(b.Object)); len(missing) > 0 {
				losses[key] = appendNew(losses[key], missing...)
			}
		}
	}
	refused, err := c.strictDryRuns(ctx, atStorage, bridge, true)
	if err != nil {
		return nil, err
	}
	for key, fields := range refused {
		losses[key] = appendNew(losses[key], fields...)
	}
	return losses, nil
}

// appendNew appends the items of more that list lacks.
func appendNew(list []string, more ...string) []string {
	for _, m := range more {
		if !slices.Contains(list, m) {
			list = append(list, m)
		}
	}
	return list
}

// listAll lists every object of gvk, in pages.
func (c *clients) listAll(ctx context.Context, gvk schema.GroupVersionKind) (map[client.ObjectKey]*unstructured.Unstructured, error) {
	out := map[client.ObjectKey]*unstructured.Unstructured{}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk)
	for {
		if err := c.client.List(ctx, list, client.Limit(500), client.Continue(list.GetContinue())); err != nil {
			return nil, fmt.Errorf("listing %s: %w", gvk, err)
		}
		for i := range list.Items {
			o := &list.Items[i]
			out[client.ObjectKeyFromObject(o)] = o
		}
		if list.GetContinue() == "" {
			return out, nil
		}
	}
}

// strictDryRuns sends every object of objs, relabelled at version, as a
// server-side dry-run update with strict field validation, and returns,
// by object, the fields the API server names for each it refuses. An
// object written since it was read is read again and sent as it is now
// (refetch), or named as changed during the check (objs are not what the
// API server returns, such as a webhook's output).
func (c *clients) strictDryRuns(ctx context.Context, objs map[client.ObjectKey]*unstructured.Unstructured, version string, refetch bool) (map[client.ObjectKey][]string, error) {
	var mu sync.Mutex
	refused := map[client.ObjectKey][]string{}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for key, o := range objs {
		g.Go(func() error {
			fields, err := c.strictDryRun(ctx, o, version, refetch)
			if err != nil || len(fields) == 0 {
				return err
			}
			mu.Lock()
			refused[key] = fields
			mu.Unlock()
			return nil
		})
	}
	return refused, g.Wait()
}

func (c *clients) strictDryRun(ctx context.Context, stored *unstructured.Unstructured, version string, refetch bool) ([]string, error) {
	obj := stored.DeepCopy()
	gvk := obj.GroupVersionKind()
	gvk.Version = version
	obj.SetGroupVersionKind(gvk)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := c.client.Update(ctx, obj.DeepCopy(), client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict))
		if apierrors.IsConflict(err) && !refetch {
			return errChangedMeanwhile
		}
		if apierrors.IsConflict(err) {
			// Written meanwhile: check what is there now.
			fresh := stored.DeepCopy()
			if gerr := c.client.Get(ctx, client.ObjectKeyFromObject(stored), fresh); gerr != nil {
				return gerr
			}
			obj = fresh
			obj.SetGroupVersionKind(gvk)
		}
		return err
	})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil, nil
	case errors.Is(err, errChangedMeanwhile):
		return []string{"changed during the check, so not checked: run it again"}, nil
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return refusedFields(err), nil
	}
	return nil, fmt.Errorf("dry run of %s at %s: %w", client.ObjectKeyFromObject(stored), version, err)
}

// errChangedMeanwhile is a dry run's conflict where objects are not read again.
var errChangedMeanwhile = errors.New("changed during the check")

// refusedFields names the fields an API error is about, without the values
// its message may quote: the causes' fields, or the unknown fields of a
// strict decoding error.
func refusedFields(err error) []string {
	var out []string
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		for _, cause := range status.Status().Details.Causes {
			if cause.Field != "" {
				out = appendNew(out, strings.TrimPrefix(cause.Field, ".")+" ("+string(cause.Type)+")")
			}
		}
	}
	msg := err.Error()
	for rest := msg; ; {
		i := strings.Index(rest, `unknown field "`)
		if i < 0 {
			break
		}
		rest = rest[i+len(`unknown field "`):]
		end := strings.Index(rest, `"`)
		if end < 0 {
			break
		}
		out = appendNew(out, strings.TrimPrefix(rest[:end], "."))
		rest = rest[end:]
	}
	if len(out) == 0 {
		out = append(out, "refused ("+string(apierrors.ReasonForError(err))+")")
	}
	return out
}

// switchStorage makes version the storage version of the live CRD, as the
// field manager that owns spec.versions, so that the user's next apply (a
// server-side apply by Helm 4 or kubectl, or a client-side one) meets no
// conflict: an Apply owner's fields are applied again as they are, with
// the storage flags moved; an Update owner's write is an update under its
// name. It returns the manager it wrote as.
func (c *clients) switchStorage(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, version string) (string, error) {
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
		if err := c.client.Apply(ctx, ac, client.FieldOwner(owner), client.ForceOwnership); err != nil {
			return "", fmt.Errorf("making %s the storage version of CRD %s as field manager %s: %w%s", version, crd.Name, owner, err, grantSpecWrite(err, crd.Name))
		}
		return owner, nil
	}
	updated := crd.DeepCopy()
	for i := range updated.Spec.Versions {
		updated.Spec.Versions[i].Storage = updated.Spec.Versions[i].Name == version
	}
	if err := c.client.Update(ctx, updated, client.FieldOwner(owner)); err != nil {
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
