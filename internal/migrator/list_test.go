package migrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNextWholeLimit: pages of whole objects hold about wholePageBytes at
// the size of the largest object seen on the page before, grow at most
// twofold from one page to the next, and stay within 1 and the page size.
func TestNextWholeLimit(t *testing.T) {
	bodies := func(sizes ...int) []json.RawMessage {
		out := make([]json.RawMessage, len(sizes))
		for i, size := range sizes {
			out[i] = make(json.RawMessage, size)
		}
		return out
	}
	small := make([]int, 10)
	for i := range small {
		small[i] = 1 << 10
	}
	for _, tc := range []struct {
		name            string
		pageSize, limit int64
		bodies          []json.RawMessage
		want            int64
	}{
		{"small objects after the first page: twice as many", 500, 10, bodies(small...), 20},
		{"small objects: the page size", 500, 400, bodies(small...), 500},
		{"100 KiB objects: 40 fit", 500, 400, bodies(100<<10, 100<<10), 40},
		{"one large object among small ones sets the size", 500, 400, bodies(1<<10, 1<<20, 1<<10), 4},
		{"objects of 1.5 MiB: 2 fit", 500, 10, bodies(3 << 19), 2},
		{"objects above the budget: one at a time", 500, 10, bodies(5 << 20), 1},
		{"an empty page: twice as many", 500, 10, nil, 20},
	} {
		if got := nextWholeLimit(tc.pageSize, tc.limit, tc.bodies); got != tc.want {
			t.Errorf("%s: limit %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestResourceVersionTooLarge: the answer of an API server whose watch
// cache has not reached a list's resourceVersion (a 504 with the cause
// kube-apiserver's storage layer sets) sends the page elsewhere; other
// timeouts, a plain error and no error do not.
func TestResourceVersionTooLarge(t *testing.T) {
	tooLarge := apierrors.NewTimeoutError("Too large resource version: 4588, current: 2578", 1)
	tooLarge.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"too large", tooLarge, true},
		{"too large, wrapped", fmt.Errorf("listing: %w", tooLarge), true},
		{"another timeout", apierrors.NewTimeoutError("the request timed out", 1), false},
		{"no status", errors.New("connection reset"), false},
		{"none", nil, false},
	} {
		if got := resourceVersionTooLarge(tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
