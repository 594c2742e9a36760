// Package policies holds fusebox's ValidatingAdmissionPolicies as data: CEL rules with which
// the API server itself refuses sandbox pods that would weaken isolation. Components turn these
// values into Kubernetes objects. The network policies are policies/sandboxnet's, which has no
// Pulumi dependency so that the manager shares it.
package policies

import (
	"errors"
	"fmt"
	"strings"

	admissionregistrationv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/admissionregistration/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Validation is one CEL rule of an admission policy: Expression must be true for the object
// to be admitted.
type Validation struct {
	Name       string // short identifier, for tests and messages
	Expression string
	Message    string
}

// AdmissionPolicy is a ValidatingAdmissionPolicy on pods with its binding to one namespace.
type AdmissionPolicy struct {
	// Name of both the policy and its binding (cluster-scoped objects).
	Name string
	// Namespace the binding (and the policy's match constraints) are limited to.
	Namespace   string
	Validations []Validation
}

// serverCapabilities, as a CEL list, are the only capabilities a sandbox container may add
// (with or without the CAP_ prefix): kubealloc.ServerCapabilities, which the sandbox server
// needs to run its commands as another user than its own (package privsep), and which Pod
// Security "baseline" allows.
const serverCapabilities = "['SETUID', 'SETGID', 'CAP_SETUID', 'CAP_SETGID']"

// ErrNoNamespace is returned by SandboxPodPolicy without a namespace: an unscoped policy would
// apply to every pod of the cluster.
var ErrNoNamespace = errors.New("admission policy needs a sandbox namespace")

// podContainerLists are the pod fields holding containers; each is checked separately because
// CEL cannot concatenate lists of Container and EphemeralContainer.
var podContainerLists = []string{"containers", "initContainers", "ephemeralContainers"}

// everyContainer returns a CEL expression true when pred (over c) holds for every container
// of every list.
func everyContainer(pred string) string {
	parts := make([]string, len(podContainerLists))
	for i, l := range podContainerLists {
		parts[i] = fmt.Sprintf("(!has(object.spec.%[1]s) || object.spec.%[1]s.all(c, %[2]s))", l, pred)
	}
	return strings.Join(parts, " && ")
}

// SandboxPodPolicy returns the policy that makes the API server refuse, in namespace, any pod
// that does not use the gvisor RuntimeClass, that gets a service-account token, that has a
// privileged container, that shares the host's network, PID or IPC namespace, that mounts a
// hostPath, or that adds capabilities other than ServerCapabilities.
func SandboxPodPolicy(namespace, runtimeClass string) (AdmissionPolicy, error) {
	if namespace == "" {
		return AdmissionPolicy{}, ErrNoNamespace
	}
	if runtimeClass == "" {
		return AdmissionPolicy{}, errors.New("admission policy needs a runtime class")
	}
	return AdmissionPolicy{
		Name:      "fusebox-sandbox-pods-" + namespace,
		Namespace: namespace,
		Validations: []Validation{
			{
				Name:       "runtime-class",
				Expression: fmt.Sprintf("has(object.spec.runtimeClassName) && object.spec.runtimeClassName == '%s'", runtimeClass),
				Message:    fmt.Sprintf("sandbox pods must set runtimeClassName: %s", runtimeClass),
			},
			{
				Name:       "no-automount-token",
				Expression: "has(object.spec.automountServiceAccountToken) && object.spec.automountServiceAccountToken == false",
				Message:    "sandbox pods must set automountServiceAccountToken: false",
			},
			{
				Name: "no-projected-token",
				Expression: "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.projected) || " +
					"!has(v.projected.sources) || v.projected.sources.all(s, !has(s.serviceAccountToken)))",
				Message: "sandbox pods must not mount a service-account token",
			},
			{
				Name:       "no-privileged",
				Expression: everyContainer("!has(c.securityContext) || !has(c.securityContext.privileged) || c.securityContext.privileged == false"),
				Message:    "sandbox pods must not have privileged containers",
			},
			{
				Name: "no-host-namespaces",
				Expression: "!(has(object.spec.hostNetwork) && object.spec.hostNetwork) && " +
					"!(has(object.spec.hostPID) && object.spec.hostPID) && " +
					"!(has(object.spec.hostIPC) && object.spec.hostIPC)",
				Message: "sandbox pods must not use the host's network, PID or IPC namespace",
			},
			{
				Name:       "no-host-path",
				Expression: "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))",
				Message:    "sandbox pods must not mount hostPath volumes",
			},
			{
				Name: "only-server-capabilities",
				Expression: everyContainer("!has(c.securityContext) || !has(c.securityContext.capabilities) || " +
					"!has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(x, x in " + serverCapabilities + ")"),
				Message: "sandbox pods must not add capabilities other than SETUID and SETGID",
			},
		},
	}, nil
}

func (p AdmissionPolicy) match() admissionregistrationv1.MatchResourcesArgs {
	return admissionregistrationv1.MatchResourcesArgs{
		NamespaceSelector: metav1.LabelSelectorArgs{
			MatchLabels: pulumi.StringMap{"kubernetes.io/metadata.name": pulumi.String(p.Namespace)},
		},
		ResourceRules: admissionregistrationv1.NamedRuleWithOperationsArray{admissionregistrationv1.NamedRuleWithOperationsArgs{
			ApiGroups:   pulumi.StringArray{pulumi.String("")},
			ApiVersions: pulumi.StringArray{pulumi.String("v1")},
			Operations:  pulumi.StringArray{pulumi.String("CREATE"), pulumi.String("UPDATE")},
			Resources:   pulumi.StringArray{pulumi.String("pods"), pulumi.String("pods/ephemeralcontainers")},
		}},
	}
}

// PolicyArgs returns the ValidatingAdmissionPolicy (failure policy Fail: if the API server
// cannot evaluate the policy the pod is refused).
func (p AdmissionPolicy) PolicyArgs() *admissionregistrationv1.ValidatingAdmissionPolicyArgs {
	var vs admissionregistrationv1.ValidationArray
	for _, v := range p.Validations {
		vs = append(vs, admissionregistrationv1.ValidationArgs{
			Expression: pulumi.String(v.Expression),
			Message:    pulumi.String(v.Message),
			Reason:     pulumi.String("Forbidden"),
		})
	}
	return &admissionregistrationv1.ValidatingAdmissionPolicyArgs{
		Metadata: metav1.ObjectMetaArgs{Name: pulumi.String(p.Name), Labels: partOf()},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpecArgs{
			FailurePolicy:    pulumi.String("Fail"),
			MatchConstraints: p.match(),
			Validations:      vs,
		},
	}
}

// BindingArgs returns the binding that enforces the policy (Deny) in p.Namespace only.
func (p AdmissionPolicy) BindingArgs() *admissionregistrationv1.ValidatingAdmissionPolicyBindingArgs {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBindingArgs{
		Metadata: metav1.ObjectMetaArgs{Name: pulumi.String(p.Name), Labels: partOf()},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpecArgs{
			PolicyName:        pulumi.String(p.Name),
			ValidationActions: pulumi.StringArray{pulumi.String("Deny")},
			MatchResources:    p.match(),
		},
	}
}

func partOf() pulumi.StringMap {
	return pulumi.StringMap{"app.kubernetes.io/part-of": pulumi.String("fusebox")}
}
