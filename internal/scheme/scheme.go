// Package scheme builds the runtime.Scheme that restow's clients share: the
// built-in types, apiextensions/v1 and restow's own API.
package scheme

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// New returns a scheme with every type restow reads or writes.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, migrationv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}
