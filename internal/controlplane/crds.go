package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/storedversions"
)

// crdReadyTimeout bounds how long a CRD may take to be established and served.
const crdReadyTimeout = 30 * time.Second

// CRDVersion describes one version of a test CRD.
type CRDVersion struct {
	Name    string
	Served  bool
	Storage bool
	// Schema is the version's OpenAPI schema; nil means an object whose spec
	// and status keep any fields.
	Schema *apiextensionsv1.JSONSchemaProps
}

// NewCRD builds a CRD for tests: group, kind and plural name, scope, and
// versions. Its kind's singular and list names follow from kind.
func NewCRD(group, kind, plural string, scope apiextensionsv1.ResourceScope, versions ...CRDVersion) *apiextensionsv1.CustomResourceDefinition {
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Scope: scope,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind:     kind,
				ListKind: kind + "List",
				Plural:   plural,
			},
		},
	}
	for _, v := range versions {
		schema := v.Schema
		if schema == nil {
			schema = OpenObjectSchema()
		}
		crd.Spec.Versions = append(crd.Spec.Versions, apiextensionsv1.CustomResourceDefinitionVersion{
			Name:         v.Name,
			Served:       v.Served,
			Storage:      v.Storage,
			Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: schema},
			Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
		})
	}
	return crd
}

// OpenObjectSchema is the schema of an object whose spec and status keep any fields.
func OpenObjectSchema() *apiextensionsv1.JSONSchemaProps {
	preserve := true
	return &apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec":   {Type: "object", XPreserveUnknownFields: &preserve},
			"status": {Type: "object", XPreserveUnknownFields: &preserve},
		},
	}
}

// InstallCRD creates a CRD and waits until the API server, every one of
// several, serves it.
func (e *ControlPlane) InstallCRD(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	if err := e.Client.Create(ctx, crd); err != nil {
		return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
	}
	return e.waitForCRDEverywhere(ctx, crd.Name)
}

// UpdateCRD applies mutate to the live CRD, retrying on conflict, and waits
// until the API server serves the result.
func (e *ControlPlane) UpdateCRD(ctx context.Context, name string, mutate func(*apiextensionsv1.CustomResourceDefinition)) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		mutate(crd)
		return e.Client.Update(ctx, crd)
	})
	if err != nil {
		return fmt.Errorf("updating CRD %s: %w", name, err)
	}
	return e.WaitForCRD(ctx, name)
}

// SetStorageVersion makes version the CRD's only storage version and waits
// until the API server (the first, of several) stores new writes at it:
// discovery shows the switch, and a canary object written through that
// server is read back from etcd at version. Discovery alone is not enough:
// an object rewritten right after it switched was once stored at the old
// version still.
func (e *ControlPlane) SetStorageVersion(ctx context.Context, name, version string) error {
	err := e.UpdateCRD(ctx, name, func(crd *apiextensionsv1.CustomResourceDefinition) {
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == version
		}
	})
	if err != nil {
		return err
	}
	return e.waitStoresAt(ctx, name, version)
}

// AgeStorageSwitch dates every managedFields entry of a CRD back by age,
// as if the release that last wrote it had been applied age ago, or as
// kubectl's move from client-side to server-side apply can leave a switch
// just made: tests show that restow does not take such a date as proof.
// The API server reverts an update that changes timestamps alone, so the
// same update sets a label, as a field manager of its own that owns
// nothing in spec.versions.
func (e *ControlPlane) AgeStorageSwitch(ctx context.Context, name string, age time.Duration) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		if len(crd.ManagedFields) == 0 {
			return fmt.Errorf("CRD %s has no managedFields to date back", name)
		}
		for i := range crd.ManagedFields {
			if t := crd.ManagedFields[i].Time; t != nil {
				crd.ManagedFields[i].Time = &metav1.Time{Time: t.Add(-age)}
			}
		}
		labels := crd.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["test.restow.dev/aged"] = strconv.FormatInt(time.Now().UnixNano(), 10)
		crd.SetLabels(labels)
		return e.Client.Update(ctx, crd, client.FieldOwner("test-clock"))
	})
}

// waitStoresAt writes canary objects of a CRD through the first API server
// until etcd holds one at version. A CRD whose schema or admission refuses
// an empty object gets no canary: discovery's word is all there is then.
func (e *ControlPlane) waitStoresAt(ctx context.Context, name, version string) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return err
	}
	canary := &unstructured.Unstructured{}
	canary.SetAPIVersion(crd.Spec.Group + "/" + version)
	canary.SetKind(crd.Spec.Names.Kind)
	if crd.Spec.Scope == apiextensionsv1.NamespaceScoped {
		canary.SetNamespace(metav1.NamespaceDefault)
	}
	var stored string
	var refused error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, crdReadyTimeout, true, func(ctx context.Context) (bool, error) {
		obj := canary.DeepCopy()
		obj.SetName(fmt.Sprintf("restow-canary-%d", time.Now().UnixNano()))
		refused = e.first.Create(ctx, obj)
		switch again, never := canaryRefused(refused); {
		case never:
			stored = canary.GetAPIVersion()
			return true, nil
		case again:
			return false, nil
		}
		read, err := e.ReadStored(ctx, crd.Spec.Group, crd.Spec.Names.Plural, obj.GetNamespace(), obj.GetName())
		if err := e.first.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return false, err
		}
		stored = read.APIVersion
		return err == nil && stored == canary.GetAPIVersion(), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the API server to store CRD %s's objects at %s (a canary was stored at %q): %w", name, version, stored, errors.Join(err, refused))
	}
	return nil
}

// DeleteCRD deletes a CRD and waits until it is gone with its objects, for
// as long as the API server keeps deleting them (ctx bounds the whole wait),
// so the next test may reuse its name. It fails, saying how many objects are
// left, once their number has not changed for a minute: a conversion webhook
// that refuses or is down, for one, stops the API server from deleting them
// (DisarmConversion, then PurgeObjects, before it).
func (e *ControlPlane) DeleteCRD(ctx context.Context, name string) error {
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := e.Client.Delete(ctx, crd); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting CRD %s: %w", name, err)
	}
	plural, group, _ := strings.Cut(name, ".")
	gone := false
	err := WaitProgress(ctx, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
		if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			gone = apierrors.IsNotFound(err)
			return gone, "", client.IgnoreNotFound(err)
		}
		left, err := e.etcd.Get(ctx, resourcePrefix(group, plural)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, "", err
		}
		return left.Count == 0, fmt.Sprintf("%d objects left in etcd", left.Count), nil
	}, nil)
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be deleted: %w", name, err)
	}
	if gone {
		return nil
	}
	// No object is left in etcd: what remains is the API server's own
	// finalizer, which retries on a backoff of its own (over a minute
	// after a few failures on a loaded machine): only ctx bounds it.
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be deleted: no object of it is left in etcd, but the API server's finalizer has not removed it (conditions %v): %w", name, crd.Status.Conditions, err)
	}
	return nil
}

// PurgeObjects deletes every object of CRD name straight from etcd, as a
// test's cleanup does before it deletes the CRD: the API server's own
// deletion of a CRD's objects deletes them one by one, seconds for each
// thousand objects a test leaves behind. The API servers' watch caches see
// the deletions as they see any, decoding each deleted object, which for a
// CRD converts it to the storage version: DisarmConversion first, or a
// refusing webhook leaves them in the caches (and the CRD's deletion
// waiting on them for good).
func (e *ControlPlane) PurgeObjects(ctx context.Context, name string) error {
	plural, group, _ := strings.Cut(name, ".")
	if _, err := e.etcd.Delete(ctx, resourcePrefix(group, plural)+"/", clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("deleting CRD %s's objects from etcd: %w", name, err)
	}
	return nil
}

// DisarmConversion makes a CRD convert without its webhook (strategy None),
// so that the API server can delete its objects whatever the webhook does:
// a test's cleanup calls it before deleting the CRD of a webhook that may be
// refusing, failing or already stopped. A CRD without a webhook is left as it is.
func (e *ControlPlane) DisarmConversion(ctx context.Context, name string) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return client.IgnoreNotFound(err)
	}
	if crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy != apiextensionsv1.WebhookConverter {
		return nil
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}
		return e.Client.Update(ctx, crd)
	})
	if err = client.IgnoreNotFound(err); err != nil {
		return fmt.Errorf("turning CRD %s's conversion webhook off: %w", name, err)
	}
	// The API server swaps the resource's storage when its informer sees the
	// update, and the deletion must not start on the old one: its deleting
	// controller backs off for longer at each failure. A list of the objects
	// that succeeds is the sign that it serves them without the webhook
	// (without this wait a refusing webhook still stopped the deletion, in
	// TestCleanupDeletesWhatTheWebhookRefuses). A storage version that is not
	// served cannot be listed: nothing to wait for then. The list covers
	// every object, which takes long on a loaded machine with thousands of
	// them: the wait lasts as long as ctx (the caller bounds it), and says
	// what the lists answered.
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: crd.Spec.Group, Version: storedversions.StorageVersion(crd), Kind: crd.Spec.Names.ListKind})
	var refused error
	attempts := 0
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		attempts++
		err := e.Client.List(ctx, list)
		if err != nil && ctx.Err() == nil {
			refused = err
		}
		return err == nil || apierrors.IsNotFound(err) || meta.IsNoMatchError(err), nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s still converts through its webhook after %d lists of its objects: %w", name, attempts, errors.Join(err, refused))
	}
	return nil
}

// canaryRefused says whether a canary's create failed for a moment (not
// served yet, a restart: try again) or for good (the CRD's schema or
// admission refuses an empty object).
func canaryRefused(err error) (again, never bool) {
	if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
		return false, true
	}
	return err != nil, false
}

// WaitForCRD waits until a CRD is established and the API server (the
// first, of several) stores at its current storage version, by the same gate
// a migration pass uses. With several API servers the others may lag
// (SetWatchLag): a storage switch waits for the first only.
func (e *ControlPlane) WaitForCRD(ctx context.Context, name string) error {
	return e.waitForCRDOn(ctx, e.ServerConfig(0), name)
}

// waitForCRDEverywhere waits for the CRD on every API server: a CRD just
// installed, which clients through the balancer will use at once.
func (e *ControlPlane) waitForCRDEverywhere(ctx context.Context, name string) error {
	for i := range e.APIServers() {
		if err := e.waitForCRDOn(ctx, e.ServerConfig(i), name); err != nil {
			return fmt.Errorf("API server %d: %w", i+1, err)
		}
	}
	return nil
}

func (e *ControlPlane) waitForCRDOn(ctx context.Context, cfg *rest.Config, name string) error {
	disco, err := clientdiscovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	var notReady string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, crdReadyTimeout, true, func(ctx context.Context) (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, err
		}
		notReady, err = storedversions.NotServingStorageVersion(disco, crd)
		return notReady == "", err
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be served: %s: %w", name, notReady, err)
	}
	return nil
}
