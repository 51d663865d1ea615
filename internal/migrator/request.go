package migrator

import (
	"k8s.io/client-go/rest"
)

// The raw requests of a pass, through the Migrator's Objects client: the
// list of whole objects (list.go) and their update as listed (write.go).

// writesWhole reports whether the first pass lists whole objects and writes
// them back as listed.
func (mg *migration) writesWhole() bool {
	return mg.m.Objects != nil && mg.target.CRD != nil && !mg.opts.ViaStatus && !mg.updateRefused.Load()
}

// request points req at the target's objects in namespace, or at the
// object name in it.
func (mg *migration) request(req *rest.Request, namespace, name string) *rest.Request {
	gvr := mg.target.Resource
	req = req.AbsPath("/apis", gvr.Group, gvr.Version)
	if mg.target.Namespaced && namespace != "" {
		req = req.Namespace(namespace)
	}
	req = req.Resource(gvr.Resource)
	if name != "" {
		req = req.Name(name)
	}
	return req
}

// answer is the body of a successful result, or the API server's error
// as the typed clients return it: Raw alone keeps only the status code.
func answer(result rest.Result) ([]byte, error) {
	if err := result.Error(); err != nil {
		return nil, err
	}
	return result.Raw()
}
