package testenv

import (
	"context"
	"errors"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FrozenMessage is the message of the policy DenyUpdates puts in force.
const FrozenMessage = "this object is frozen"

// DenyUpdates puts in force a ValidatingAdmissionPolicy that denies every
// update to obj (an object of resource, matched by name) with FrozenMessage,
// and returns a function that removes the policy. It returns once the policy
// denies a probe: a label patch to obj, which therefore must exist and must
// not mind being written before the policy takes hold.
func (e *Env) DenyUpdates(ctx context.Context, obj client.Object, resource string) (remove func(context.Context) error, err error) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	rule := admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{gvk.Group}, APIVersions: []string{"*"}, Resources: []string{resource}},
	}}
	remove, err = e.EnforcePolicy(ctx, "deny-"+obj.GetName(), rule, fmt.Sprintf("object.metadata.name != '%s'", obj.GetName()), FrozenMessage)
	if err != nil {
		return nil, err
	}
	probe := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"restow.dev/probe":"x"}}}`))
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := e.Client.Patch(ctx, obj, probe)
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("the policy never denied an update: %w", err), remove(ctx))
	}
	return remove, nil
}

// EnforcePolicy puts in force a ValidatingAdmissionPolicy named name, and
// its binding, that denies with message the requests rule matches for which
// expression does not hold, and returns a function that removes both. It
// does not wait for the policy to take hold: the caller probes for that.
func (e *Env) EnforcePolicy(ctx context.Context, name string, rule admissionregistrationv1.NamedRuleWithOperations, expression, message string) (remove func(context.Context) error, err error) {
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{rule}},
			Validations:      []admissionregistrationv1.Validation{{Expression: expression, Message: message}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	remove = func(ctx context.Context) error {
		return errors.Join(
			client.IgnoreNotFound(e.Client.Delete(ctx, binding)),
			client.IgnoreNotFound(e.Client.Delete(ctx, policy)),
		)
	}
	for _, o := range []client.Object{policy, binding} {
		if err := e.Client.Create(ctx, o); err != nil {
			return nil, errors.Join(err, remove(ctx))
		}
	}
	return remove, nil
}
