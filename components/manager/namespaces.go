package manager

import (
	"errors"
	"fmt"

	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// NamespacesType is the Namespaces component's type token.
const NamespacesType = "fusebox:components:Namespaces"

// NamespacesArgs name the manager's and the sandboxes' namespaces.
type NamespacesArgs struct {
	Manager string `pulumi:"manager"`
	Sandbox string `pulumi:"sandbox"`
	// Existing uses namespaces made beforehand (for example to hold image pull secrets)
	// instead of creating them; their Pod Security labels are then the operator's.
	Existing bool `pulumi:"existing"`
}

// Namespaces are the two namespaces of an installation. They are a component of their own so
// that the sandbox namespace's network and admission policies can be created after them but
// before the manager's Deployment (which would otherwise create sandbox pods unprotected).
type Namespaces struct {
	pulumi.ResourceState

	// Manager and Sandbox are the namespaces' names, as outputs of the Namespace objects so
	// that resources using them wait for them.
	Manager pulumi.StringOutput `pulumi:"manager"`
	Sandbox pulumi.StringOutput `pulumi:"sandbox"`
}

// ErrSameNamespace is returned when the manager and sandboxes would share a namespace: the
// sandbox namespace's policies would then confine (or expose) the manager.
var ErrSameNamespace = errors.New("manager and sandbox namespaces must differ")

// NewNamespaces registers the component and both namespaces. The sandbox namespace enforces
// the "baseline" Pod Security Standard (the admission policy adds fusebox's stricter rules);
// the manager namespace enforces "restricted".
func NewNamespaces(ctx *pulumi.Context, name string, args *NamespacesArgs, opts ...pulumi.ResourceOption) (*Namespaces, error) {
	if args == nil || args.Manager == "" || args.Sandbox == "" {
		return nil, fmt.Errorf("namespaces %s: manager and sandbox namespace names are required", name)
	}
	if args.Manager == args.Sandbox {
		return nil, fmt.Errorf("namespaces %s: %w", name, ErrSameNamespace)
	}
	c := &Namespaces{}
	if err := ctx.RegisterComponentResource(NamespacesType, name, c, opts...); err != nil {
		return nil, err
	}
	mk := func(suffix, ns, pss string) (pulumi.StringOutput, error) {
		if args.Existing {
			return pulumi.String(ns).ToStringOutput(), nil
		}
		n, err := corev1.NewNamespace(ctx, name+"-"+suffix, &corev1.NamespaceArgs{
			Metadata: metav1.ObjectMetaArgs{
				Name: pulumi.String(ns),
				Labels: pulumi.StringMap{
					"app.kubernetes.io/part-of":          pulumi.String("fusebox"),
					"pod-security.kubernetes.io/enforce": pulumi.String(pss),
				},
			},
		}, pulumi.Parent(c))
		if err != nil {
			return pulumi.StringOutput{}, fmt.Errorf("namespaces %s: %s: %w", name, ns, err)
		}
		return n.Metadata.Name().Elem(), nil
	}
	var err error
	if c.Manager, err = mk("manager", args.Manager, "restricted"); err != nil {
		return nil, err
	}
	if c.Sandbox, err = mk("sandbox", args.Sandbox, "baseline"); err != nil {
		return nil, err
	}
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{"manager": c.Manager, "sandbox": c.Sandbox}); err != nil {
		return nil, err
	}
	return c, nil
}
