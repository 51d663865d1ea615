package cli

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/restow/restow/internal/preflight"
)

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

// roundTrip proves, for a CRD whose conversion is a webhook, that no object
// loses a field when it is stored at bridge. The API server's reads cannot
// say it (what it returns at the bridge is what the webhook made, and field
// names may differ between versions), so each object, read at each version
// of stored (where it may be stored), is sent to the bridge and back
// through the CRD's webhook, with the API server's own conversion code
// (which calls the webhook's URL, or its Service at
// <name>.<namespace>.svc: inside the cluster), and what comes back must
// equal what went in, field by field, labels and annotations included.
// The bridge's form of each is then sent in a strict server-side dry run
// at the bridge, which names fields the bridge's schema lacks (the API
// server prunes those from what the webhook returns). It returns, by
// object, what would be lost: fields, or "conversion to <bridge> failed"
// for an object the webhook refuses, which the migration could not move.
func (c *clients) roundTrip(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, stored []string, bridge string) (map[client.ObjectKey][]string, error) {
	factory, err := conversion.NewCRConverterFactory(webhook.NewDefaultServiceResolver(), nil)
	if err != nil {
		return nil, err
	}
	convertor, _, err := factory.NewConverter(crd)
	if err != nil {
		return nil, fmt.Errorf("calling the conversion webhook of CRD %s: %w", crd.Name, err)
	}
	gv := func(version string) schema.GroupVersion {
		return schema.GroupVersion{Group: crd.Spec.Group, Version: version}
	}
	losses := map[client.ObjectKey][]string{}
	for _, version := range stored {
		if version == bridge {
			continue
		}
		objs, err := c.listAll(ctx, gv(version).WithKind(crd.Spec.Names.Kind))
		if err != nil {
			return nil, err
		}
		keys := make([]client.ObjectKey, 0, len(objs))
		for k := range objs {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b client.ObjectKey) int { return strings.Compare(a.String(), b.String()) })
		bridged := map[client.ObjectKey]*unstructured.Unstructured{}
		converted := 0
		var firstErr error
		for batch := range slices.Chunk(keys, roundTripBatch) {
			items := make([]*unstructured.Unstructured, 0, len(batch))
			for _, k := range batch {
				items = append(items, objs[k])
			}
			there, back, err := convertBoth(ctx, convertor, items, gv(bridge), gv(version))
			if err != nil {
				// Find the objects it refuses, one at a time.
				there, back = make([]*unstructured.Unstructured, len(items)), make([]*unstructured.Unstructured, len(items))
				for i, o := range items {
					t, b, err := convertBoth(ctx, convertor, []*unstructured.Unstructured{o}, gv(bridge), gv(version))
					if err != nil {
						firstErr = cmpOr(firstErr, err)
						losses[batch[i]] = appendNew(losses[batch[i]], "conversion to "+bridge+" and back failed")
						continue
					}
					there[i], back[i] = t[0], b[0]
				}
			}
			for i, k := range batch {
				if there[i] == nil {
					continue
				}
				converted++
				bridged[k] = there[i]
				if lost := preflight.Changed(items[i].Object, back[i].Object); len(lost) > 0 {
					losses[k] = appendNew(losses[k], lost...)
				}
			}
		}
		if converted == 0 && firstErr != nil {
			return nil, fmt.Errorf("the conversion webhook of CRD %s converted none of its objects, so restow cannot prove a round trip through %s keeps their fields (a webhook behind a Service is reached at <name>.<namespace>.svc: run prepare inside the cluster, as the prepare Job does): %w", crd.Name, bridge, firstErr)
		}
		refused, err := c.strictDryRuns(ctx, bridged, bridge)
		if err != nil {
			return nil, err
		}
		for k, fields := range refused {
			losses[k] = appendNew(losses[k], fields...)
		}
	}
	return losses, nil
}

// cmpOr is err if first is nil, else first.
func cmpOr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

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
