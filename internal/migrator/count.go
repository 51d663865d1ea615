package migrator

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/pager"
)

// Count returns how many objects a pass over target would visit. It asks for
// one object and reads the list's remainingItemCount; where the API server
// gives none, it lists every object's metadata, page by page, and counts.
func (m *Migrator) Count(ctx context.Context, target Target) (int64, error) {
	resource := target.scope(m.Metadata.Resource(target.Resource))
	first, err := resource.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, err
	}
	switch {
	case first.Continue == "":
		return int64(len(first.Items)), nil
	case first.RemainingItemCount != nil:
		return int64(len(first.Items)) + *first.RemainingItemCount, nil
	}
	return m.CountAll(ctx, target, DefaultPageSize)
}

// CountAll lists every object's metadata in pages of pageSize and counts
// them, as a dry run of a pass does.
func (m *Migrator) CountAll(ctx context.Context, target Target, pageSize int64) (int64, error) {
	resource := target.scope(m.Metadata.Resource(target.Resource))
	p := pager.New(pager.SimplePageFunc(func(opts metav1.ListOptions) (runtime.Object, error) {
		return resource.List(ctx, opts)
	}))
	p.PageSize = pageSize
	var n int64
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(runtime.Object) error {
		n++
		return nil
	})
	return n, err
}
