package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
)

// The API server's default --etcd-prefix.
const etcdPrefix = "/registry"

// protobufPrefix starts every object the API server stores as protobuf
// (built-in types); custom resources are stored as JSON.
var protobufPrefix = []byte("k8s\x00")

// StoredObject is an object as etcd holds it.
type StoredObject struct {
	// Key is the etcd key.
	Key string
	// Raw is the value as stored.
	Raw []byte
	// APIVersion and Kind are read from the stored bytes: the version the
	// object is encoded at, whatever version a client reads it through.
	APIVersion string
	Kind       string
}

// Key returns the etcd key of an object, as the API server lays keys out:
// /registry/<group>/<resource>[/<namespace>]/<name>, without the group for
// the core group. Resources the API server stores under another name (a few
// built-ins) are not covered.
func Key(group, resource, namespace, name string) string {
	return path.Join(resourcePrefix(group, resource), namespace, name)
}

func resourcePrefix(group, resource string) string {
	return path.Join(etcdPrefix, group, resource)
}

// ReadStored reads one object straight from etcd.
func (e *ControlPlane) ReadStored(ctx context.Context, group, resource, namespace, name string) (StoredObject, error) {
	key := Key(group, resource, namespace, name)
	resp, err := e.etcd.Get(ctx, key)
	if err != nil {
		return StoredObject{}, fmt.Errorf("reading %s from etcd: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return StoredObject{}, fmt.Errorf("etcd has no key %s", key)
	}
	return decodeStored(key, resp.Kvs[0].Value)
}

// StoreAt rewrites the value etcd holds for an object of a custom resource
// as encoded at apiVersion, its content otherwise as it is: what a write
// that began on the old storage leaves when it commits after the switch.
// The API server sees it through its watch of etcd, and the object's
// resourceVersion moves. Custom resources are stored as JSON; an encrypted
// or protobuf value is refused.
func (e *ControlPlane) StoreAt(ctx context.Context, group, resource, namespace, name, apiVersion string) error {
	key := Key(group, resource, namespace, name)
	resp, err := e.etcd.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("reading %s from etcd: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("etcd has no key %s", key)
	}
	var obj map[string]any
	if err := json.Unmarshal(resp.Kvs[0].Value, &obj); err != nil {
		return fmt.Errorf("%s is not stored as JSON: %w", key, err)
	}
	obj["apiVersion"] = apiVersion
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if _, err := e.etcd.Put(ctx, key, string(data)); err != nil {
		return fmt.Errorf("writing %s to etcd: %w", key, err)
	}
	return nil
}

// StoredVersions reads every object of a resource straight from etcd and
// counts them by the apiVersion they are encoded at.
func (e *ControlPlane) StoredVersions(ctx context.Context, group, resource string) (map[string]int, error) {
	return e.countStored(ctx, resourcePrefix(group, resource)+"/")
}

// BuiltInStoredVersions is StoredVersions for a built-in resource, which
// kube-apiserver keeps under /registry/<resource>/ whatever its group.
func (e *ControlPlane) BuiltInStoredVersions(ctx context.Context, resource string) (map[string]int, error) {
	return e.countStored(ctx, path.Join(etcdPrefix, resource)+"/")
}

func (e *ControlPlane) countStored(ctx context.Context, prefix string) (map[string]int, error) {
	counts := map[string]int{}
	err := e.forEachStoredUnder(ctx, prefix, func(o StoredObject) error {
		counts[o.APIVersion]++
		return nil
	})
	return counts, err
}

// forEachStoredUnder calls fn for every object whose key starts with
// prefix, reading in pages so a large resource never sits in memory at once.
func (e *ControlPlane) forEachStoredUnder(ctx context.Context, prefix string, fn func(StoredObject) error) error {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	for {
		resp, err := e.etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(500))
		if err != nil {
			return fmt.Errorf("listing %s in etcd: %w", prefix, err)
		}
		for _, kv := range resp.Kvs {
			o, err := decodeStored(string(kv.Key), kv.Value)
			if err != nil {
				return err
			}
			if err := fn(o); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

func decodeStored(key string, raw []byte) (StoredObject, error) {
	o := StoredObject{Key: key, Raw: raw}
	switch {
	case bytes.HasPrefix(raw, protobufPrefix):
		var unknown runtime.Unknown
		if err := unknown.Unmarshal(raw[len(protobufPrefix):]); err != nil {
			return o, fmt.Errorf("decoding protobuf envelope of %s: %w", key, err)
		}
		o.APIVersion, o.Kind = unknown.APIVersion, unknown.Kind
	case bytes.HasPrefix(raw, []byte("{")):
		var typeMeta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(raw, &typeMeta); err != nil {
			return o, fmt.Errorf("decoding JSON of %s: %w", key, err)
		}
		o.APIVersion, o.Kind = typeMeta.APIVersion, typeMeta.Kind
	default:
		return o, fmt.Errorf("value of %s is neither JSON nor Kubernetes protobuf (encrypted, or CBOR?): starts with %q", key, raw[:min(len(raw), 8)])
	}
	if o.APIVersion == "" {
		return o, errors.New("value of " + key + " carries no apiVersion")
	}
	return o, nil
}

// CompactEtcd compacts etcd at its current revision, as the API server's
// periodic compaction does: list snapshots older than now expire, and a
// continue token taken from one answers 410 Expired.
func (e *ControlPlane) CompactEtcd(ctx context.Context) error {
	resp, err := e.etcd.Get(ctx, etcdPrefix, clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	_, err = e.etcd.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	return err
}
