package preflight

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The check: that no object loses a field at the bridge, for conversion
// None by the API server's own reads (readLosses) and strict dry runs
// (strictDryRuns), for a webhook by a round trip (roundtrip.go); and how
// losses are named (nameLosses: objects and fields, never values).

// shownLosses is how many objects a field check names.
const shownLosses = 10

// fieldCheck proves, before prepare writes anything, that no object of crd
// loses a field when it is stored at v.Bridge, and makes v blocked,
// naming the objects and fields (never their values), if any would: with
// conversion None, by comparing what the API server reads at each version
// (readLosses); with a webhook, by a round trip through it (roundTrip).
// Every version objects may be stored at must be served, or they cannot
// be read. A webhook is trusted with the objects written while the storage
// version switches only with p.TrustWebhook (--trust-conversion-webhook): no
// check can see those.
func (p *Preparer) fieldCheck(ctx context.Context, crd, manifest *apiextensionsv1.CustomResourceDefinition, v *Verdict) error {
	block := func(format string, args ...any) {
		v.State = Blocked
		v.Reason = fmt.Sprintf("the manifest drops %s, the live storage version; ", v.Storage) + fmt.Sprintf(format, args...)
	}
	stored := storedAt(crd)
	live := LiveOf(crd)
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
		trip, err := p.roundTrip(ctx, crd, stored, v.Bridge)
		if err != nil {
			return unchecked(v, err)
		}
		losses = trip.all()
		// Field names may differ between versions: only the bridge's own
		// schema, live and in the release, can be compared.
		versions = []string{v.Bridge}
	} else {
		var err error
		if losses, err = p.readLosses(ctx, crd, versions, v.Bridge); err != nil {
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
	loss := SchemaLoss(crd, versions, crd, v.Bridge)
	if manifest != nil {
		loss = append(loss, SchemaLoss(crd, versions, manifest, v.Bridge)...)
	}
	if len(loss) > 0 {
		block("no object sets a field %s lacks now, but the schemas allow fields it does not (%s): an object written with one before the migration ends, or read after the release's apply, would lose it. Nothing was changed. Apply a release that keeps %s first",
			v.Bridge, strings.Join(slices.Compact(loss), "; "), v.Storage)
		return nil
	}
	if viaWebhook(crd) {
		if !p.TrustWebhook {
			block("its conversion is a webhook, and a round trip through it to %s and back kept every field of every object stored now; but an object written at %s while the storage version switches goes through the webhook unchecked, so restow bridges only with --trust-conversion-webhook, which vouches for the webhook. Nothing was changed", v.Bridge, v.Storage)
			return nil
		}
		v.Warnings = append(v.Warnings, fmt.Sprintf("the conversion webhook took every object stored now to %s and back without loss; prepare checks again right after it switches the storage version and moves it back on a loss, but objects written at %s after that are the webhook's to convert (--trust-conversion-webhook): pause their writers. The release's own webhook must convert from %s too", v.Bridge, v.Storage, v.Bridge))
	}
	owner, _ := versionsOwner(crd)
	v.Warnings = append(v.Warnings, fmt.Sprintf("prepare writes the storage version as field manager %s, which owns spec.versions; if %s re-applies this CRD during prepare (an operator that manages its own CRDs, a GitOps self-heal), it moves the storage version back and prepare stops, pruning nothing: pause it first", owner, owner))
	return nil
}

// webhookError is a round trip that the conversion webhook did not let
// happen (unreachable from here, down, or failing for every object): the
// fields are unchecked, which preflight says and prepare refuses to act on.
type webhookError struct{ err error }

func (e *webhookError) Error() string { return e.err.Error() }
func (e *webhookError) Unwrap() error { return e.err }

// unchecked records on v a round trip the webhook did not let happen, as
// v.Unchecked and a warning, and returns nil; any other error is returned.
func unchecked(v *Verdict, err error) error {
	var we *webhookError
	if !errors.As(err, &we) {
		return err
	}
	v.Unchecked = we.Error()
	v.Warnings = append(v.Warnings, "not checked from here: "+we.Error()+"; prepare makes the round trip before it changes anything, and stops if it cannot")
	return nil
}

// webhookCheck proves, for a CRD whose conversion is a webhook and whose
// live storage version the manifest keeps, that migrating its objects
// there loses no field: a round trip from each other version objects may
// be stored at (as after a storage switch that prepare made, then
// interrupted, or that the release made). A field lost makes v blocked; an
// object the webhook refuses does not, since the migration cannot move it
// either and names it, pruning nothing.
func (p *Preparer) webhookCheck(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, v *Verdict) error {
	live := LiveOf(crd)
	stored := slices.DeleteFunc(storedAt(crd), func(s string) bool { return s == live.Storage })
	if _, ok := unserved(live, stored); ok {
		// Not readable: the migration's own reads convert them.
		return nil
	}
	trip, err := p.roundTrip(ctx, crd, stored, live.Storage)
	if err != nil {
		return unchecked(v, err)
	}
	if len(trip.lost) > 0 {
		v.State = Blocked
		v.Reason = fmt.Sprintf("its conversion webhook would lose fields of %s migrated to %s, the storage version: %s. Nothing was changed. Fix the webhook, or move those fields out of the objects, first",
			objectCount(len(trip.lost)), live.Storage, nameLosses(trip.lost))
	}
	return nil
}

// aheadCheck holds a migration ahead of a later release (Preparer.Ahead)
// through a conversion webhook to what webhookCheck asks of any: one that
// would lose a field, or that cannot be checked from here, is not made
// (v.AheadNow false, and a warning says why). The apply passes either way,
// so the CRD is not blocked.
func (p *Preparer) aheadCheck(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, v *Verdict) error {
	check := Verdict{CRD: v.CRD, State: NeedsPrepare}
	if err := p.webhookCheck(ctx, crd, &check); err != nil {
		return err
	}
	why := check.Unchecked
	if check.State == Blocked {
		why = check.Reason
	}
	if why != "" {
		v.AheadNow = false
		v.Warnings = append(v.Warnings, "prepare --ahead leaves it as it is: "+why)
	}
	return nil
}

// storedAt lists the versions crd's objects may be stored at:
// status.storedVersions and the storage version.
func storedAt(crd *apiextensionsv1.CustomResourceDefinition) []string {
	live := LiveOf(crd)
	return appendNew(slices.Clone(live.StoredVersions), live.Storage)
}

// unserved is the first of versions that live does not serve, if any.
func unserved(live Live, versions []string) (string, bool) {
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
func (p *Preparer) readLosses(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, versions []string, bridge string) (map[client.ObjectKey][]string, error) {
	storage := LiveOf(crd).Storage
	at := func(version string) (map[client.ObjectKey]*unstructured.Unstructured, error) {
		return p.listAll(ctx, schema.GroupVersionKind{Group: crd.Spec.Group, Version: version, Kind: crd.Spec.Names.Kind})
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
				if err := p.Client.Get(ctx, key, b); apierrors.IsNotFound(err) {
					continue
				} else if err != nil {
					return nil, fmt.Errorf("reading %s at %s: %w", key, bridge, err)
				}
			}
			if missing := Missing(FieldPaths(o.Object), FieldPaths(b.Object)); len(missing) > 0 {
				losses[key] = appendNew(losses[key], missing...)
			}
		}
	}
	refused, err := p.strictDryRuns(ctx, atStorage, bridge, true)
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
func (p *Preparer) listAll(ctx context.Context, gvk schema.GroupVersionKind) (map[client.ObjectKey]*unstructured.Unstructured, error) {
	out := map[client.ObjectKey]*unstructured.Unstructured{}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk)
	for {
		if err := p.Client.List(ctx, list, client.Limit(500), client.Continue(list.GetContinue())); err != nil {
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
func (p *Preparer) strictDryRuns(ctx context.Context, objs map[client.ObjectKey]*unstructured.Unstructured, version string, refetch bool) (map[client.ObjectKey][]string, error) {
	var mu sync.Mutex
	refused := map[client.ObjectKey][]string{}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for key, o := range objs {
		g.Go(func() error {
			fields, err := p.strictDryRun(ctx, o, version, refetch)
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

func (p *Preparer) strictDryRun(ctx context.Context, stored *unstructured.Unstructured, version string, refetch bool) ([]string, error) {
	obj := stored.DeepCopy()
	gvk := obj.GroupVersionKind()
	gvk.Version = version
	obj.SetGroupVersionKind(gvk)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := p.Client.Update(ctx, obj.DeepCopy(), client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict))
		if apierrors.IsConflict(err) && !refetch {
			return errChangedMeanwhile
		}
		if apierrors.IsConflict(err) {
			// Written meanwhile: check what is there now.
			fresh := stored.DeepCopy()
			if gerr := p.Client.Get(ctx, client.ObjectKeyFromObject(stored), fresh); gerr != nil {
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
