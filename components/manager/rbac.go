package manager

import (
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// policyResources are the API group and resource of each policy kind the manager writes per
// sandbox, by flavour.
var policyResources = map[sandboxnet.Flavour][][2]string{
	sandboxnet.Cilium:     {{"cilium.io", "ciliumnetworkpolicies"}},
	sandboxnet.GKE:        {{"networking.k8s.io", "networkpolicies"}, {"networking.gke.io", "fqdnnetworkpolicies"}},
	sandboxnet.Kubernetes: {{"networking.k8s.io", "networkpolicies"}},
}

// managerVerbs are the verbs the manager has on its sandbox pods and their network policies.
var managerVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// leaseVerbs are what client-go's leader election needs on its Lease.
var leaseVerbs = []string{"get", "create", "update"}

// namespacedRole is one of the manager's Roles, bound to its ServiceAccount.
type namespacedRole struct {
	suffix, role string
	ns           pulumi.StringInput
	rules        rbacv1.PolicyRuleArray
}

// namespacedRoles are the manager's Roles: namespaced only. Sandbox pods and their
// per-sandbox network policies in the sandbox namespace; the leader-election Lease, the TLS
// Secret, the CA ConfigMap and its own Deployment (watched for its deletion, whose
// RemovalFinalizer it removes once the sandboxes are gone) in the manager's own namespace.
func (a *ManagerArgs) namespacedRoles() []namespacedRole {
	return []namespacedRole{
		{"sandbox-role", sandboxRoleName, a.SandboxNamespace, sandboxRules(sandboxnet.Flavour(a.NetworkPolicy))},
		{"election-role", electionRoleName, a.Namespace, rbacv1.PolicyRuleArray{
			rule("coordination.k8s.io", "leases", leaseVerbs),
		}},
		// The TLS Secret: read and watched (list and watch with a name field selector are
		// authorised by resourceNames), created when absent (create cannot be limited by
		// name); the CA ConfigMap likewise, and updated as the Secret rotates.
		{"tls-role", tlsRoleName, a.Namespace, rbacv1.PolicyRuleArray{
			namedRule("", "secrets", []string{"get", "list", "watch"}, a.tlsSecret()),
			rule("", "secrets", []string{"create"}),
			namedRule("", "configmaps", []string{"get", "update"}, CAConfigMapName),
			rule("", "configmaps", []string{"create"}),
		}},
		{"removal-role", removalRoleName, a.Namespace, rbacv1.PolicyRuleArray{
			namedRule("apps", "deployments", []string{"get", "list", "watch", "update"}, ObjectName),
		}},
	}
}

// managerSubjects is the manager's ServiceAccount as a binding's subject.
func (a *ManagerArgs) managerSubjects() rbacv1.SubjectArray {
	return rbacv1.SubjectArray{rbacv1.SubjectArgs{
		Kind: pulumi.String("ServiceAccount"), Name: pulumi.String(ObjectName), Namespace: a.Namespace,
	}}
}

// rbac registers the manager's Roles and their bindings, the TokenReview ClusterRole and its
// binding (the Deployment waits for all of them, returned), and the CA reader's Role.
func (k *children) rbac(sa pulumi.Resource) ([]pulumi.Resource, error) {
	var rbac []pulumi.Resource
	for _, r := range k.a.namespacedRoles() {
		role, binding, err := k.namespacedRole(r, sa)
		if err != nil {
			return nil, err
		}
		rbac = append(rbac, role, binding)
	}
	role, binding, err := k.tokenReviewRole(sa)
	if err != nil {
		return nil, err
	}
	rbac = append(rbac, role, binding)
	if err := k.caReaderRole(); err != nil {
		return nil, err
	}
	return rbac, nil
}

func (k *children) namespacedRole(r namespacedRole, sa pulumi.Resource) (role, binding pulumi.Resource, err error) {
	role, err = rbacv1.NewRole(k.ctx, k.name+"-"+r.suffix, &rbacv1.RoleArgs{
		Metadata: k.meta(r.role, r.ns), Rules: r.rules,
	}, k.parent)
	if err != nil {
		return nil, nil, k.errorf("role "+r.role, err)
	}
	binding, err = rbacv1.NewRoleBinding(k.ctx, k.name+"-"+r.suffix+"-binding", &rbacv1.RoleBindingArgs{
		Metadata: k.meta(r.role, r.ns),
		RoleRef: rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Kind: pulumi.String("Role"), Name: pulumi.String(r.role),
		},
		Subjects: k.a.managerSubjects(),
	}, k.parent, pulumi.DependsOn([]pulumi.Resource{role, sa}))
	if err != nil {
		return nil, nil, k.errorf("role binding "+r.role, err)
	}
	return role, binding, nil
}

// tokenReviewRole is the one cluster-scoped right: checking agents' tokens (TokenReview).
func (k *children) tokenReviewRole(sa pulumi.Resource) (role, binding pulumi.Resource, err error) {
	role, err = rbacv1.NewClusterRole(k.ctx, k.name+"-tokenreview-role", &rbacv1.ClusterRoleArgs{
		Metadata: k.clusterMeta(TokenReviewRoleName),
		Rules:    rbacv1.PolicyRuleArray{rule("authentication.k8s.io", "tokenreviews", []string{"create"})},
	}, k.parent)
	if err != nil {
		return nil, nil, k.errorf("cluster role "+TokenReviewRoleName, err)
	}
	binding, err = rbacv1.NewClusterRoleBinding(k.ctx, k.name+"-tokenreview-binding", &rbacv1.ClusterRoleBindingArgs{
		Metadata: k.clusterMeta(TokenReviewRoleName),
		RoleRef: rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Kind: pulumi.String("ClusterRole"), Name: pulumi.String(TokenReviewRoleName),
		},
		Subjects: k.a.managerSubjects(),
	}, k.parent, pulumi.DependsOn([]pulumi.Resource{role, sa}))
	if err != nil {
		return nil, nil, k.errorf("cluster role binding "+TokenReviewRoleName, err)
	}
	return role, binding, nil
}

// caReaderRole lets agents read the CA from the manager namespace: a CA certificate is
// public, so any authenticated user may get that one ConfigMap.
func (k *children) caReaderRole() error {
	role, err := rbacv1.NewRole(k.ctx, k.name+"-ca-reader-role", &rbacv1.RoleArgs{
		Metadata: k.meta(caReaderRoleName, k.a.Namespace),
		Rules:    rbacv1.PolicyRuleArray{namedRule("", "configmaps", []string{"get"}, CAConfigMapName)},
	}, k.parent)
	if err != nil {
		return k.errorf("role "+caReaderRoleName, err)
	}
	if _, err := rbacv1.NewRoleBinding(k.ctx, k.name+"-ca-reader-role-binding", &rbacv1.RoleBindingArgs{
		Metadata: k.meta(caReaderRoleName, k.a.Namespace),
		RoleRef: rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Kind: pulumi.String("Role"), Name: pulumi.String(caReaderRoleName),
		},
		Subjects: rbacv1.SubjectArray{rbacv1.SubjectArgs{
			Kind: pulumi.String("Group"), ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Name: pulumi.String("system:authenticated"),
		}},
	}, k.parent, pulumi.DependsOn([]pulumi.Resource{role})); err != nil {
		return k.errorf("role binding "+caReaderRoleName, err)
	}
	return nil
}

func namedRule(group, resource string, verbs []string, names ...string) rbacv1.PolicyRuleArgs {
	r := rule(group, resource, verbs)
	r.ResourceNames = pulumi.ToStringArray(names)
	return r
}

// sandboxRules are the manager's rights in the sandbox namespace: its pods, and the policy
// kinds of the flavour (deleting the namespace-wide policies is among them: least privilege
// here is per namespace and kind, not per object).
func sandboxRules(f sandboxnet.Flavour) rbacv1.PolicyRuleArray {
	rules := rbacv1.PolicyRuleArray{rule("", "pods", managerVerbs)}
	for _, r := range policyResources[f] {
		rules = append(rules, rule(r[0], r[1], managerVerbs))
	}
	return rules
}

func rule(group, resource string, verbs []string) rbacv1.PolicyRuleArgs {
	return rbacv1.PolicyRuleArgs{
		ApiGroups: pulumi.StringArray{pulumi.String(group)},
		Resources: pulumi.StringArray{pulumi.String(resource)},
		Verbs:     pulumi.ToStringArray(verbs),
	}
}
