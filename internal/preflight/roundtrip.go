package preflight

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/conversion"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/util/webhook"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The round trip through a CRD's conversion webhook, with the API server's
// own conversion code: the check where field names may differ between
// versions, so that reads cannot compare them.

const (
	// roundTripBatch is how many objects one ConversionReview carries.
	roundTripBatch = 100
	// webhookTimeout bounds one call of a conversion webhook: the API
	// server's own calls have none, so a webhook that never answers would
	// hold prepare until --timeout.
	webhookTimeout = 30 * time.Second
)

// viaWebhook says whether crd's conversion is a webhook.
func viaWebhook(crd *apiextensionsv1.CustomResourceDefinition) bool {
	return crd.Spec.Conversion != nil && crd.Spec.Conversion.Strategy == apiextensionsv1.WebhookConverter
}

// tripResult is what a round trip found, by object: fields lost (or
// objects changed meanwhile, which were not checked), and objects the
// webhook would not convert, which a migration could not move either.
type tripResult struct {
	lost, refused map[client.ObjectKey][]string
}

// all is lost and refused together.
func (r tripResult) all() map[client.ObjectKey][]string {
	out := maps.Clone(r.lost)
	for k, v := range r.refused {
		out[k] = appendNew(out[k], v...)
	}
	return out
}

// roundTrip proves, for a CRD whose conversion is a webhook, that no object
// loses a field when it is stored at version to. The API server's reads
// cannot say it (what it returns at to is what the webhook made, and field
// names may differ between versions), so each object, read at each version
// of stored (where it may be stored), is sent to to and back through the
// CRD's webhook, with the API server's own conversion code (which calls
// the webhook's URL, or its Service at <name>.<namespace>.svc: inside the
// cluster), and what comes back must equal what went in, field by field,
// labels and annotations included. The converted form of each is then sent
// in a strict server-side dry run at to, which names fields to's schema
// lacks (the API server prunes those from what the webhook returns); an
// object written meanwhile counts as lost, since what was checked is not
// what is stored. A webhook that converts none of them is an error, never
// a pass.
func (p *Preparer) roundTrip(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, stored []string, to string) (tripResult, error) {
	trip := tripResult{lost: map[client.ObjectKey][]string{}, refused: map[client.ObjectKey][]string{}}
	factory, err := conversion.NewCRConverterFactory(webhook.NewDefaultServiceResolver(), nil)
	if err != nil {
		return trip, err
	}
	convertor, _, err := factory.NewConverter(crd)
	if err != nil {
		return trip, &webhookError{fmt.Errorf("calling the conversion webhook of CRD %s: %w", crd.Name, err)}
	}
	gv := func(version string) schema.GroupVersion {
		return schema.GroupVersion{Group: crd.Spec.Group, Version: version}
	}
	for _, version := range stored {
		if version == to {
			continue
		}
		objs, err := p.listAll(ctx, gv(version).WithKind(crd.Spec.Names.Kind))
		if err != nil {
			return trip, err
		}
		converted, err := tripAll(ctx, convertor, objs, gv(to), gv(version), trip)
		if err != nil {
			return trip, &webhookError{fmt.Errorf("the conversion webhook of CRD %s: %w, so restow cannot prove a round trip through %s keeps the objects' fields (a webhook behind a Service is reached at <name>.<namespace>.svc: run this inside the cluster, as the prepare Job does)", crd.Name, err, to)}
		}
		refused, err := p.strictDryRuns(ctx, converted, to, false)
		if err != nil {
			return trip, err
		}
		for k, fields := range refused {
			trip.lost[k] = appendNew(trip.lost[k], fields...)
		}
	}
	return trip, nil
}

// tripAll converts objs to there and back, in batches, records in trip
// what each lost or why it was refused, and returns the objects as
// converted to there. It fails when the webhook fails for every object it
// tries one at a time before converting any (a webhook down, unreachable
// or broken, rather than refusing some objects).
func tripAll(ctx context.Context, convertor runtime.ObjectConvertor, objs map[client.ObjectKey]*unstructured.Unstructured, there, back schema.GroupVersion, trip tripResult) (map[client.ObjectKey]*unstructured.Unstructured, error) {
	keys := slices.SortedFunc(maps.Keys(objs), func(a, b client.ObjectKey) int { return strings.Compare(a.String(), b.String()) })
	converted := map[client.ObjectKey]*unstructured.Unstructured{}
	failedInRow := 0
	for batch := range slices.Chunk(keys, roundTripBatch) {
		items := make([]*unstructured.Unstructured, 0, len(batch))
		for _, k := range batch {
			items = append(items, objs[k])
		}
		outs, backs, err := convertBoth(ctx, convertor, items, there, back)
		if err != nil {
			// Find the objects it refuses, one at a time.
			outs, backs = make([]*unstructured.Unstructured, len(items)), make([]*unstructured.Unstructured, len(items))
			for i, o := range items {
				out, b, err := convertBoth(ctx, convertor, []*unstructured.Unstructured{o}, there, back)
				if err != nil {
					if failedInRow++; failedInRow >= failuresToGiveUp && len(converted) == 0 {
						return nil, err
					}
					trip.refused[batch[i]] = appendNew(trip.refused[batch[i]], "conversion to "+there.Version+" and back failed")
					continue
				}
				failedInRow = 0
				outs[i], backs[i] = out[0], b[0]
			}
		}
		for i, k := range batch {
			if outs[i] == nil {
				continue
			}
			converted[k] = outs[i]
			if lost := Changed(items[i].Object, backs[i].Object); len(lost) > 0 {
				trip.lost[k] = appendNew(trip.lost[k], lost...)
			}
		}
	}
	return converted, nil
}

// failuresToGiveUp is how many objects in a row, none converted before,
// the webhook may fail before tripAll concludes it fails for all.
const failuresToGiveUp = 3

// convertBoth converts objs to there and the results back to back, as one
// ConversionReview each way; it returns both, in the order of objs.
func convertBoth(ctx context.Context, convertor runtime.ObjectConvertor, objs []*unstructured.Unstructured, there, back schema.GroupVersion) ([]*unstructured.Unstructured, []*unstructured.Unstructured, error) {
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion(objs[0].GetAPIVersion())
	list.SetKind(objs[0].GetKind() + "List")
	for _, o := range objs {
		list.Items = append(list.Items, *o.DeepCopy())
	}
	thereList, err := convertWithin(ctx, convertor, list, there)
	if err != nil {
		return nil, nil, err
	}
	backList, err := convertWithin(ctx, convertor, thereList.DeepCopy(), back)
	if err != nil {
		return nil, nil, err
	}
	if len(thereList.Items) != len(objs) || len(backList.Items) != len(objs) {
		return nil, nil, fmt.Errorf("the conversion webhook returned %d and %d objects for %d", len(thereList.Items), len(backList.Items), len(objs))
	}
	pointers := func(l *unstructured.UnstructuredList) []*unstructured.Unstructured {
		out := make([]*unstructured.Unstructured, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out
	}
	return pointers(thereList), pointers(backList), nil
}

// convertWithin converts list to gv, giving up when ctx ends or after
// webhookTimeout: the API server's conversion code takes no context.
func convertWithin(ctx context.Context, convertor runtime.ObjectConvertor, list *unstructured.UnstructuredList, gv schema.GroupVersion) (*unstructured.UnstructuredList, error) {
	ctx, cancel := context.WithTimeout(ctx, webhookTimeout)
	defer cancel()
	type result struct {
		out runtime.Object
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := convertor.ConvertToVersion(list, gv)
		done <- result{out, err}
	}()
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("the conversion webhook did not answer: %w", ctx.Err())
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		out, ok := r.out.(*unstructured.UnstructuredList)
		if !ok {
			return nil, errors.New("the conversion returned no list")
		}
		return out, nil
	}
}
