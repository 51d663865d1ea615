package controlplane

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// createWorkers bounds parallel creates; the test client allows 2,000 requests a second.
const createWorkers = 32

// EnsureNamespaces creates the namespaces that do not exist yet; "" is skipped.
func (e *ControlPlane) EnsureNamespaces(ctx context.Context, namespaces ...string) error {
	for _, ns := range namespaces {
		if ns == "" {
			continue
		}
		err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// CreateObjects creates object(0) to object(n-1) in parallel and returns the
// first error.
func (e *ControlPlane) CreateObjects(ctx context.Context, n int, object func(i int) client.Object) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan int)
	var wg sync.WaitGroup
	for range createWorkers {
		wg.Go(func() {
			for i := range work {
				if err := e.Client.Create(ctx, object(i)); err != nil {
					cancel(err)
				}
			}
		})
	}
	for i := range n {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}
