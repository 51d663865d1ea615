package migrator_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/metadata"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// TestLookupWhileTheWatchCacheCannotStart: one object that the conversion
// webhook refuses keeps the API server's watch cache of the resource from
// (re)initializing after the storage switch, and a list by field selector,
// which only that cache serves, answers 429 "storage is (re)initializing"
// (client-go retrying it for minutes) for as long as the object is there. A
// pass that looked objects up that way made no progress
// (controllers.TestOneUnconvertibleObjectDoesNotBlockTheRest ran into its
// 15-minute ceiling so on a loaded machine). The lookup lists one object
// from the object's key instead, which the API server reads from etcd while
// its cache is not ready, and tells an object that is there from one that
// is gone.
func TestLookupWhileTheWatchCacheCannotStart(t *testing.T) {
	const refused = "obj-00000"
	hook := testenv.StartConversionWebhook(t, func(obj *unstructured.Unstructured, _ string) error {
		if obj.GetName() == refused {
			return errors.New("this webhook cannot convert " + refused)
		}
		return nil
	})
	fx := testenv.Fixture{Env: env, Group: "lookup.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true, Conversion: hook.Conversion()}
	fx.Install(t, "v1beta1", "v1")
	keys := fx.CreateObjects(t, "v1beta1", 20, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "lookup")
	fx.SwitchStorage(t, "v1")
	m, _ := newMigrator(t)
	target := resolve(t, m, fx)

	// The cache's state, as a list by field selector sees it.
	md, err := metadata.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	// client-go retries a 429 up to ten times, each after the API server
	// waited for its cache: bounded here to 20 s a try.
	selectorList := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		_, err := md.Resource(target.Resource).Namespace("lookup").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", keys[5].Name).String()})
		return err
	}
	testenv.WaitProgress(t, "a list by field selector to fail", time.Minute, func(ctx context.Context) (bool, string, error) {
		err := selectorList()
		return apierrors.IsTooManyRequests(err) || errors.Is(err, context.DeadlineExceeded), fmt.Sprint(err), nil
	})
	t.Logf("a list by field selector answers: %v", selectorList())

	there := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "lookup", Name: keys[5].Name}}
	found, err := migrator.Lookup(t.Context(), m, target, there)
	if err != nil || found == nil || found.Name != keys[5].Name || found.UID == "" {
		t.Errorf("Lookup(%s) = %+v, %v; want the object", keys[5].Name, found, err)
	}
	gone := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "lookup", Name: "obj-00005x"}}
	if found, err := migrator.Lookup(t.Context(), m, target, gone); err != nil || found != nil {
		t.Errorf("Lookup of an object that is not there = %+v, %v; want nil, nil", found, err)
	}
}
