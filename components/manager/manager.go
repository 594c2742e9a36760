// Package manager provides the components that run fusebox's container manager in a cluster:
// Namespaces (the manager's and the sandboxes') and Manager (ServiceAccount, least-privilege
// RBAC, the sandbox pod template and the authorisation policy as ConfigMaps, TLS from a
// Secret the manager creates (or the user's) with its CA published for agents, TokenReview for
// agents' projected tokens, a Deployment of at least two replicas with
// anti-affinity, gRPC health probes and a restricted security context, a Service and a
// PodDisruptionBudget). Images are referenced by digest only.
package manager

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	policyv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/policy/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"sigs.k8s.io/yaml"
)

// Type is the Manager component's type token.
const Type = "fusebox:components:Manager"

// Ports and paths of the manager's pods.
const (
	DefaultGRPCPort    = 9090
	DefaultMetricsPort = 9464
	templateMountPath  = "/etc/fusebox/sandbox"
	// StateDir is the manager's --state-dir (its lock file): a writable emptyDir, since the
	// root filesystem is read-only. Replicas coordinate through the API server, not through it.
	StateDir = "/var/lib/fusebox"
	// SandboxTemplatePath is where the manager reads the sandbox pod template: the
	// ConfigMap's SandboxTemplateKey, mounted at templateMountPath.
	SandboxTemplatePath = templateMountPath + "/" + SandboxTemplateKey
	// nonRootUID is the distroless "nonroot" user.
	nonRootUID = 65532
)

// ManagerArgs configure the Manager component.
type ManagerArgs struct {
	// Namespace and SandboxNamespace: pass the Namespaces component's outputs. Required.
	Namespace        pulumi.StringInput `pulumi:"namespace"`
	SandboxNamespace pulumi.StringInput `pulumi:"sandboxNamespace"`
	// Image is the manager image, by digest. Required.
	Image string `pulumi:"image"`
	// Sandbox describes the sandbox pods the manager creates. Its Image is required.
	Sandbox SandboxTemplate `pulumi:"-"`
	// SkipAwait stops Pulumi from waiting for the Deployment and Service to become ready: only
	// for control planes that cannot run the manager's pods (tests without controllers).
	SkipAwait bool `pulumi:"skipAwait"`
	// Replicas is at least 2 (default 2): one manager is a single point of failure.
	Replicas int `pulumi:"replicas"`
	// RequiredAntiAffinity forbids two replicas on one node; otherwise it is only preferred
	// (single-node dev clusters).
	RequiredAntiAffinity bool `pulumi:"requiredAntiAffinity"`
	// PoolSize and PoolMax are the warm pool's floor and ceiling (defaults 2 and 16).
	PoolSize int `pulumi:"poolSize"`
	PoolMax  int `pulumi:"poolMax"`
	// Estimator sizes the pool: fixed, ewma or pid (default ewma).
	Estimator string `pulumi:"estimator"`
	// GRPCPort and MetricsPort default to 9090 and 9464.
	GRPCPort    int `pulumi:"grpcPort"`
	MetricsPort int `pulumi:"metricsPort"`
	// ServiceType is ClusterIP (default) or LoadBalancer.
	ServiceType string `pulumi:"serviceType"`
	// CPU and Memory are the manager container's requests (memory is also its limit).
	CPU    string `pulumi:"cpu"`
	Memory string `pulumi:"memory"`
	// After lists resources the Deployment waits for: the sandbox namespace's network and
	// admission policies, so that no sandbox pod exists before they do.
	After []pulumi.Resource `pulumi:"-"`
	// TokenAudience is the audience agents' projected ServiceAccount tokens must carry
	// (default DefaultTokenAudience).
	TokenAudience string `pulumi:"tokenAudience"`
	// TLSSecret names a TLS Secret in the manager namespace that the user provides (tls.crt,
	// tls.key, ca.crt: cert-manager compatible). Empty: the manager creates TLSSecretName with
	// a self-signed CA at its first start (no key is in the Pulumi state) and publishes the CA.
	TLSSecret string `pulumi:"tlsSecret"`
	// Access is the authorisation policy: who may allocate, which templates, which egress
	// ceiling (see manager/auth.PolicyFile). Empty: no agent may allocate.
	Access []AccessRule `pulumi:"access"`
	// Operators are ServiceAccounts ("namespace/name") that see every tenant's sandboxes.
	Operators []string `pulumi:"operators"`
	// NetworkPolicy is the cluster's policy flavour (sandboxnet: cilium, gke or kubernetes;
	// default cilium): which per-sandbox policies the manager writes.
	NetworkPolicy string `pulumi:"networkPolicy"`
	// AgentNamespaces are where the agents run: their pods labelled AgentLabels (default
	// fusebox.dev/agent=true) reach their bound sandboxes' data port. AgentCIDRs reach it from
	// outside the cluster. At least one of the two is required.
	AgentNamespaces []string          `pulumi:"agentNamespaces"`
	AgentCIDRs      []string          `pulumi:"agentCIDRs"`
	AgentLabels     map[string]string `pulumi:"agentLabels"`
	// ImagePullSecrets name Secrets (in both namespaces) for pulling the manager and sandbox
	// images from a private registry.
	ImagePullSecrets []string `pulumi:"imagePullSecrets"`
}

// AccessRule is one rule of the manager's authorisation policy (manager/auth.RuleFile).
type AccessRule struct {
	// Namespaces whose every ServiceAccount the rule names, and single ServiceAccounts
	// ("namespace/name").
	Namespaces      []string `pulumi:"namespaces"`
	ServiceAccounts []string `pulumi:"serviceAccounts"`
	// Templates the callers may use; empty: all.
	Templates []string `pulumi:"templates"`
	// Egress is the ceiling of the callers' allowlists ("host:port", "*.domain:port",
	// addresses and CIDR blocks with a port); empty: no egress.
	Egress []string `pulumi:"egress"`
}

// Manager is the deployed manager.
type Manager struct {
	pulumi.ResourceState

	// Endpoint is the manager's in-cluster gRPC address (host:port).
	Endpoint pulumi.StringOutput `pulumi:"endpoint"`
	// ServiceAccount is the manager's service account name.
	ServiceAccount pulumi.StringOutput `pulumi:"serviceAccount"`
	// Replicas is the Deployment's replica count.
	Replicas pulumi.IntOutput `pulumi:"replicas"`
	// TokenAudience is the audience agents' tokens must carry.
	TokenAudience pulumi.StringOutput `pulumi:"tokenAudience"`
	// CAConfigMap is the ConfigMap in the manager namespace holding the CA (key ca.crt) that
	// agents verify the manager with; any authenticated user may read it.
	CAConfigMap pulumi.StringOutput `pulumi:"caConfigMap"`
}

// Errors for refused arguments.
var (
	ErrTooFewReplicas = errors.New("manager needs at least 2 replicas")
	ErrNoNamespace    = errors.New("manager and sandbox namespaces are required")
	ErrNoAgents       = errors.New("agent namespaces (or agent CIDRs) are required: without them no agent can reach its sandbox")
)

// The label agents' pods carry unless AgentLabels says otherwise.
const (
	DefaultAgentLabelKey   = "fusebox.dev/agent"
	DefaultAgentLabelValue = "true"
)

// Names of the Kubernetes objects (fixed, so the manager and operators can find them).
const (
	ObjectName       = "fusebox-manager"
	TemplateCMName   = "fusebox-sandbox-template"
	sandboxRoleName  = "fusebox-manager-sandboxes"
	electionRoleName = "fusebox-manager-leader-election"
	tlsRoleName      = "fusebox-manager-tls"
	caReaderRoleName = "fusebox-manager-ca-reader"
	// TokenReviewRoleName is the one cluster-wide role: checking agents' tokens.
	TokenReviewRoleName = "fusebox-manager-tokenreview"
	// TLSSecretName is the TLS Secret the manager creates when the user provides none.
	TLSSecretName = "fusebox-manager-tls"
	// CAConfigMapName is where the manager publishes its CA (key ca.crt).
	CAConfigMapName = "fusebox-manager-ca"
	// PolicyCMName holds the authorisation policy (key PolicyKey).
	PolicyCMName    = "fusebox-manager-policy"
	PolicyKey       = "policy.yaml"
	policyMountPath = "/etc/fusebox/policy"
	// DefaultTokenAudience is the default audience of agents' tokens.
	DefaultTokenAudience = "fusebox-manager"
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

// NewManager registers the component and its children.
func NewManager(ctx *pulumi.Context, name string, args *ManagerArgs, opts ...pulumi.ResourceOption) (*Manager, error) {
	if args == nil {
		return nil, fmt.Errorf("manager %s: args are required", name)
	}
	a := *args
	if err := a.defaults(); err != nil {
		return nil, fmt.Errorf("manager %s: %w", name, err)
	}
	tmpl, err := a.Sandbox.YAML()
	if err != nil {
		return nil, fmt.Errorf("manager %s: %w", name, err)
	}
	policy, err := a.policyYAML()
	if err != nil {
		return nil, fmt.Errorf("manager %s: access: %w", name, err)
	}
	c := &Manager{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(c)
	labels := pulumi.StringMap{
		"app.kubernetes.io/name":    pulumi.String(components.ManagerAppLabel),
		"app.kubernetes.io/part-of": pulumi.String("fusebox"),
	}
	var annotations pulumi.StringMap
	if a.SkipAwait {
		annotations = pulumi.StringMap{"pulumi.com/skipAwait": pulumi.String("true")}
	}
	meta := func(n string, ns pulumi.StringInput) metav1.ObjectMetaArgs {
		return metav1.ObjectMetaArgs{Name: pulumi.String(n), Namespace: ns, Labels: labels, Annotations: annotations}
	}

	sa, err := corev1.NewServiceAccount(ctx, name+"-sa", &corev1.ServiceAccountArgs{
		Metadata: meta(ObjectName, a.Namespace),
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("manager %s: service account: %w", name, err)
	}
	subjects := rbacv1.SubjectArray{rbacv1.SubjectArgs{
		Kind: pulumi.String("ServiceAccount"), Name: pulumi.String(ObjectName), Namespace: a.Namespace,
	}}

	// RBAC: namespaced Roles only. Sandbox pods and their per-sandbox network policies in the
	// sandbox namespace; the leader-election Lease in the manager's own namespace.
	roles := []struct {
		suffix, role string
		ns           pulumi.StringInput
		rules        rbacv1.PolicyRuleArray
	}{
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
	}
	var rbac []pulumi.Resource
	for _, r := range roles {
		role, err := rbacv1.NewRole(ctx, name+"-"+r.suffix, &rbacv1.RoleArgs{
			Metadata: meta(r.role, r.ns), Rules: r.rules,
		}, parent)
		if err != nil {
			return nil, fmt.Errorf("manager %s: role %s: %w", name, r.role, err)
		}
		rb, err := rbacv1.NewRoleBinding(ctx, name+"-"+r.suffix+"-binding", &rbacv1.RoleBindingArgs{
			Metadata: meta(r.role, r.ns),
			RoleRef: rbacv1.RoleRefArgs{
				ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Kind: pulumi.String("Role"), Name: pulumi.String(r.role),
			},
			Subjects: subjects,
		}, parent, pulumi.DependsOn([]pulumi.Resource{role, sa}))
		if err != nil {
			return nil, fmt.Errorf("manager %s: role binding %s: %w", name, r.role, err)
		}
		rbac = append(rbac, role, rb)
	}

	// Checking agents' tokens (TokenReview) is cluster-scoped: the one ClusterRole.
	crole, err := rbacv1.NewClusterRole(ctx, name+"-tokenreview-role", &rbacv1.ClusterRoleArgs{
		Metadata: metav1.ObjectMetaArgs{Name: pulumi.String(TokenReviewRoleName), Labels: labels, Annotations: annotations},
		Rules:    rbacv1.PolicyRuleArray{rule("authentication.k8s.io", "tokenreviews", []string{"create"})},
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("manager %s: cluster role %s: %w", name, TokenReviewRoleName, err)
	}
	crb, err := rbacv1.NewClusterRoleBinding(ctx, name+"-tokenreview-binding", &rbacv1.ClusterRoleBindingArgs{
		Metadata: metav1.ObjectMetaArgs{Name: pulumi.String(TokenReviewRoleName), Labels: labels, Annotations: annotations},
		RoleRef: rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Kind: pulumi.String("ClusterRole"), Name: pulumi.String(TokenReviewRoleName),
		},
		Subjects: subjects,
	}, parent, pulumi.DependsOn([]pulumi.Resource{crole, sa}))
	if err != nil {
		return nil, fmt.Errorf("manager %s: cluster role binding %s: %w", name, TokenReviewRoleName, err)
	}
	rbac = append(rbac, crole, crb)

	// Agents read the CA from the manager namespace: a CA certificate is public, so any
	// authenticated user may get that one ConfigMap.
	caRole, err := rbacv1.NewRole(ctx, name+"-ca-reader-role", &rbacv1.RoleArgs{
		Metadata: meta(caReaderRoleName, a.Namespace),
		Rules:    rbacv1.PolicyRuleArray{namedRule("", "configmaps", []string{"get"}, CAConfigMapName)},
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("manager %s: role %s: %w", name, caReaderRoleName, err)
	}
	if _, err := rbacv1.NewRoleBinding(ctx, name+"-ca-reader-role-binding", &rbacv1.RoleBindingArgs{
		Metadata: meta(caReaderRoleName, a.Namespace),
		RoleRef: rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Kind: pulumi.String("Role"), Name: pulumi.String(caReaderRoleName),
		},
		Subjects: rbacv1.SubjectArray{rbacv1.SubjectArgs{
			Kind: pulumi.String("Group"), ApiGroup: pulumi.String("rbac.authorization.k8s.io"), Name: pulumi.String("system:authenticated"),
		}},
	}, parent, pulumi.DependsOn([]pulumi.Resource{caRole})); err != nil {
		return nil, fmt.Errorf("manager %s: role binding %s: %w", name, caReaderRoleName, err)
	}

	policyCM, err := corev1.NewConfigMap(ctx, name+"-policy", &corev1.ConfigMapArgs{
		Metadata: meta(PolicyCMName, a.Namespace),
		Data:     pulumi.StringMap{PolicyKey: pulumi.String(policy)},
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("manager %s: authorisation policy: %w", name, err)
	}

	cm, err := corev1.NewConfigMap(ctx, name+"-sandbox-template", &corev1.ConfigMapArgs{
		Metadata: meta(TemplateCMName, a.Namespace),
		Data:     pulumi.StringMap{SandboxTemplateKey: pulumi.String(tmpl)},
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("manager %s: sandbox template: %w", name, err)
	}

	deps := append(append([]pulumi.Resource{cm, policyCM}, rbac...), a.After...)
	if _, err := appsv1.NewDeployment(ctx, name+"-deployment", &appsv1.DeploymentArgs{
		Metadata: meta(ObjectName, a.Namespace),
		Spec:     a.deploymentSpec(labels),
	}, parent, pulumi.DependsOn(deps)); err != nil {
		return nil, fmt.Errorf("manager %s: deployment: %w", name, err)
	}

	svc, err := corev1.NewService(ctx, name+"-service", &corev1.ServiceArgs{
		Metadata: meta(ObjectName, a.Namespace),
		Spec: corev1.ServiceSpecArgs{
			Type:     pulumi.String(a.ServiceType),
			Selector: selectorLabels(),
			Ports: corev1.ServicePortArray{
				corev1.ServicePortArgs{Name: pulumi.String("grpc"), Port: pulumi.Int(a.GRPCPort), TargetPort: pulumi.String("grpc"), AppProtocol: pulumi.String("grpc")},
				corev1.ServicePortArgs{Name: pulumi.String("metrics"), Port: pulumi.Int(a.MetricsPort), TargetPort: pulumi.String("metrics")},
			},
		},
	}, parent)
	if err != nil {
		return nil, fmt.Errorf("manager %s: service: %w", name, err)
	}

	if _, err := policyv1.NewPodDisruptionBudget(ctx, name+"-pdb", &policyv1.PodDisruptionBudgetArgs{
		Metadata: meta(ObjectName, a.Namespace),
		Spec: policyv1.PodDisruptionBudgetSpecArgs{
			MinAvailable: pulumi.Int(1),
			Selector:     metav1.LabelSelectorArgs{MatchLabels: selectorLabels()},
		},
	}, parent); err != nil {
		return nil, fmt.Errorf("manager %s: pod disruption budget: %w", name, err)
	}

	c.Endpoint = pulumi.Sprintf("%s.%s.svc:%d", svc.Metadata.Name().Elem(), a.Namespace, a.GRPCPort)
	c.ServiceAccount = sa.Metadata.Name().Elem()
	c.Replicas = pulumi.Int(a.Replicas).ToIntOutput()
	c.TokenAudience = pulumi.String(a.TokenAudience).ToStringOutput()
	c.CAConfigMap = pulumi.String(CAConfigMapName).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{
		"endpoint":       c.Endpoint,
		"serviceAccount": c.ServiceAccount,
		"replicas":       c.Replicas,
		"tokenAudience":  c.TokenAudience,
		"caConfigMap":    c.CAConfigMap,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (a *ManagerArgs) defaults() error {
	if a.Namespace == nil || a.SandboxNamespace == nil {
		return ErrNoNamespace
	}
	if err := components.ValidateImage(a.Image); err != nil {
		return fmt.Errorf("manager image: %w", err)
	}
	if err := components.ValidateImage(a.Sandbox.Image); err != nil {
		return fmt.Errorf("sandbox image: %w", err)
	}
	if a.Replicas == 0 {
		a.Replicas = 2
	}
	if a.Replicas < 2 {
		return fmt.Errorf("%w (got %d)", ErrTooFewReplicas, a.Replicas)
	}
	if a.PoolSize == 0 {
		a.PoolSize = 2
	}
	if a.PoolMax == 0 {
		a.PoolMax = 16
	}
	if a.PoolSize < 0 || a.PoolMax < a.PoolSize {
		return fmt.Errorf("pool size %d and max %d: want 0 <= size <= max", a.PoolSize, a.PoolMax)
	}
	a.Estimator = or(a.Estimator, "ewma")
	switch a.Estimator {
	case "fixed", "ewma", "pid":
	default:
		return fmt.Errorf("estimator %q: want fixed, ewma or pid", a.Estimator)
	}
	if a.GRPCPort == 0 {
		a.GRPCPort = DefaultGRPCPort
	}
	if a.MetricsPort == 0 {
		a.MetricsPort = DefaultMetricsPort
	}
	a.ServiceType = or(a.ServiceType, "ClusterIP")
	if a.ServiceType != "ClusterIP" && a.ServiceType != "LoadBalancer" {
		return fmt.Errorf("service type %q: want ClusterIP or LoadBalancer", a.ServiceType)
	}
	a.CPU = or(a.CPU, "250m")
	a.Memory = or(a.Memory, "256Mi")
	a.TokenAudience = or(a.TokenAudience, DefaultTokenAudience)
	a.NetworkPolicy = or(a.NetworkPolicy, string(sandboxnet.Cilium))
	if _, err := sandboxnet.ParseFlavour(a.NetworkPolicy); err != nil {
		return err
	}
	if len(a.AgentNamespaces) == 0 && len(a.AgentCIDRs) == 0 {
		return ErrNoAgents
	}
	if len(a.AgentLabels) == 0 {
		a.AgentLabels = map[string]string{DefaultAgentLabelKey: DefaultAgentLabelValue}
	}
	for _, s := range a.ImagePullSecrets {
		if s == "" {
			return errors.New("empty image pull secret name")
		}
	}
	a.Sandbox.ImagePullSecrets = a.ImagePullSecrets
	return nil
}

// tlsSecret is the TLS Secret's name: the user's, or the one the manager creates.
func (a *ManagerArgs) tlsSecret() string { return or(a.TLSSecret, TLSSecretName) }

// policyYAML renders and checks the authorisation policy (errors name the key at fault).
func (a *ManagerArgs) policyYAML() (string, error) {
	f := auth.PolicyFile{Rules: []auth.RuleFile{}, Operators: a.Operators}
	for _, r := range a.Access {
		f.Rules = append(f.Rules, auth.RuleFile{Namespaces: r.Namespaces, ServiceAccounts: r.ServiceAccounts, Templates: r.Templates, Egress: r.Egress})
	}
	if _, err := auth.NewPolicy(f); err != nil {
		return "", err
	}
	out, err := yaml.Marshal(f)
	return string(out), err
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

func selectorLabels() pulumi.StringMap {
	return pulumi.StringMap{"app.kubernetes.io/name": pulumi.String(components.ManagerAppLabel)}
}

func rule(group, resource string, verbs []string) rbacv1.PolicyRuleArgs {
	return rbacv1.PolicyRuleArgs{
		ApiGroups: pulumi.StringArray{pulumi.String(group)},
		Resources: pulumi.StringArray{pulumi.String(resource)},
		Verbs:     pulumi.ToStringArray(verbs),
	}
}

// listArgs are the manager's list-valued flags that are set.
func (a *ManagerArgs) listArgs() pulumi.StringArray {
	var out pulumi.StringArray
	for _, f := range []struct {
		flag string
		vals []string
	}{{"--agent-namespaces", a.AgentNamespaces}, {"--agent-cidrs", a.AgentCIDRs}, {"--image-pull-secrets", a.ImagePullSecrets}} {
		if len(f.vals) > 0 {
			out = append(out, pulumi.String(f.flag+"="+strings.Join(f.vals, ",")))
		}
	}
	return out
}

// labelList renders labels as the manager's key=value,key=value flags (sorted).
func labelList(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func pullSecrets(names []string) corev1.LocalObjectReferenceArray {
	var out corev1.LocalObjectReferenceArray
	for _, n := range names {
		out = append(out, corev1.LocalObjectReferenceArgs{Name: pulumi.String(n)})
	}
	return out
}

func (a *ManagerArgs) deploymentSpec(labels pulumi.StringMap) appsv1.DeploymentSpecArgs {
	yes, no := pulumi.Bool(true), pulumi.Bool(false)
	term := corev1.PodAffinityTermArgs{
		LabelSelector: metav1.LabelSelectorArgs{MatchLabels: selectorLabels()},
		TopologyKey:   pulumi.String("kubernetes.io/hostname"),
	}
	anti := corev1.PodAntiAffinityArgs{}
	if a.RequiredAntiAffinity {
		anti.RequiredDuringSchedulingIgnoredDuringExecution = corev1.PodAffinityTermArray{term}
	} else {
		anti.PreferredDuringSchedulingIgnoredDuringExecution = corev1.WeightedPodAffinityTermArray{
			corev1.WeightedPodAffinityTermArgs{Weight: pulumi.Int(100), PodAffinityTerm: term},
		}
	}
	// Liveness and startup ask for the health service's overall status, SERVING once the
	// process serves; readiness for the Manager service's, SERVING once the warm pool has
	// first held a ready sandbox (so Pulumi's wait for the Deployment covers the pool).
	probe := func(service string, period, failures int) corev1.ProbeArgs {
		return corev1.ProbeArgs{
			Grpc:             corev1.GRPCActionArgs{Port: pulumi.Int(a.GRPCPort), Service: pulumi.String(service)},
			PeriodSeconds:    pulumi.Int(period),
			FailureThreshold: pulumi.Int(failures),
		}
	}
	return appsv1.DeploymentSpecArgs{
		Replicas: pulumi.Int(a.Replicas),
		Selector: metav1.LabelSelectorArgs{MatchLabels: selectorLabels()},
		Strategy: appsv1.DeploymentStrategyArgs{
			Type: pulumi.String("RollingUpdate"),
			RollingUpdate: appsv1.RollingUpdateDeploymentArgs{
				MaxUnavailable: pulumi.Int(0), MaxSurge: pulumi.Int(1),
			},
		},
		Template: corev1.PodTemplateSpecArgs{
			Metadata: metav1.ObjectMetaArgs{Labels: labels},
			Spec: corev1.PodSpecArgs{
				ServiceAccountName: pulumi.String(ObjectName),
				Affinity:           corev1.AffinityArgs{PodAntiAffinity: anti},
				SecurityContext: corev1.PodSecurityContextArgs{
					RunAsNonRoot:   yes,
					RunAsUser:      pulumi.Int(nonRootUID),
					RunAsGroup:     pulumi.Int(nonRootUID),
					FsGroup:        pulumi.Int(nonRootUID),
					SeccompProfile: corev1.SeccompProfileArgs{Type: pulumi.String("RuntimeDefault")},
				},
				Containers: corev1.ContainerArray{corev1.ContainerArgs{
					Name:  pulumi.String("manager"),
					Image: pulumi.String(a.Image),
					Args: append(pulumi.StringArray{
						pulumi.Sprintf("--listen=tcp://0.0.0.0:%d", a.GRPCPort),
						pulumi.Sprintf("--metrics-listen=0.0.0.0:%d", a.MetricsPort),
						// The flags of fusebox-manager, the image's entrypoint (cmd/internal/daemoncmd); Kubernetes
						// expands $(POD_NAMESPACE) and $(POD_NAME) from the env below. Agents
						// are the pods labelled fusebox.dev/agent=true.
						pulumi.String("--allocator=kube"),
						pulumi.Sprintf("--sandbox-namespace=%s", a.SandboxNamespace),
						pulumi.String("--manager-namespace=$(POD_NAMESPACE)"),
						pulumi.String("--identity=$(POD_NAME)"),
						pulumi.String("--sandbox-image=" + a.Sandbox.Image),
						pulumi.String("--sandbox-template=" + SandboxTemplatePath),
						pulumi.String("--agent-selector=" + labelList(a.AgentLabels)),
						pulumi.String("--manager-selector=app.kubernetes.io/name=" + components.ManagerAppLabel),
						pulumi.String("--network-policy=" + a.NetworkPolicy),
						pulumi.String("--state-dir=" + StateDir),
						pulumi.String("--leader-elect=true"),
						pulumi.Sprintf("--estimator=%s", a.Estimator),
						pulumi.Sprintf("--pool-size=%d", a.PoolSize),
						pulumi.Sprintf("--pool-max=%d", a.PoolMax),
						// The API: TLS with the Secret's certificate for the Service's names,
						// agents' tokens checked for the audience, the authorisation policy.
						pulumi.String("--tls-secret=" + a.tlsSecret()),
						pulumi.Sprintf("--tls-secret-create=%t", a.TLSSecret == ""),
						pulumi.Sprintf("--tls-dns-names=%s,%s.%s,%s.%s.svc,%s.%s.svc.cluster.local", ObjectName, ObjectName, a.Namespace,
							ObjectName, a.Namespace, ObjectName, a.Namespace),
						pulumi.String("--ca-configmap=" + CAConfigMapName),
						pulumi.String("--token-audience=" + a.TokenAudience),
						pulumi.String("--auth-policy=" + policyMountPath + "/" + PolicyKey),
					}, a.listArgs()...),
					Env: corev1.EnvVarArray{corev1.EnvVarArgs{
						Name: pulumi.String("POD_NAMESPACE"),
						ValueFrom: corev1.EnvVarSourceArgs{FieldRef: corev1.ObjectFieldSelectorArgs{
							FieldPath: pulumi.String("metadata.namespace"),
						}},
					}, corev1.EnvVarArgs{
						Name: pulumi.String("POD_NAME"),
						ValueFrom: corev1.EnvVarSourceArgs{FieldRef: corev1.ObjectFieldSelectorArgs{
							FieldPath: pulumi.String("metadata.name"),
						}},
					}},
					Ports: corev1.ContainerPortArray{
						corev1.ContainerPortArgs{Name: pulumi.String("grpc"), ContainerPort: pulumi.Int(a.GRPCPort)},
						corev1.ContainerPortArgs{Name: pulumi.String("metrics"), ContainerPort: pulumi.Int(a.MetricsPort)},
					},
					StartupProbe:   probe("", 2, 30),
					ReadinessProbe: probe(ReadinessService, 2, 2),
					LivenessProbe:  probe("", 10, 3),
					Resources: corev1.ResourceRequirementsArgs{
						Requests: pulumi.StringMap{"cpu": pulumi.String(a.CPU), "memory": pulumi.String(a.Memory)},
						Limits:   pulumi.StringMap{"memory": pulumi.String(a.Memory)},
					},
					SecurityContext: corev1.SecurityContextArgs{
						RunAsNonRoot:             yes,
						AllowPrivilegeEscalation: no,
						ReadOnlyRootFilesystem:   yes,
						Privileged:               no,
						Capabilities:             corev1.CapabilitiesArgs{Drop: pulumi.StringArray{pulumi.String("ALL")}},
						SeccompProfile:           corev1.SeccompProfileArgs{Type: pulumi.String("RuntimeDefault")},
					},
					VolumeMounts: corev1.VolumeMountArray{
						corev1.VolumeMountArgs{Name: pulumi.String("sandbox-template"), MountPath: pulumi.String(templateMountPath), ReadOnly: yes},
						corev1.VolumeMountArgs{Name: pulumi.String("policy"), MountPath: pulumi.String(policyMountPath), ReadOnly: yes},
						corev1.VolumeMountArgs{Name: pulumi.String("tmp"), MountPath: pulumi.String("/tmp")},
						corev1.VolumeMountArgs{Name: pulumi.String("state"), MountPath: pulumi.String(StateDir)},
					},
				}},
				Volumes: corev1.VolumeArray{
					corev1.VolumeArgs{
						Name:      pulumi.String("sandbox-template"),
						ConfigMap: corev1.ConfigMapVolumeSourceArgs{Name: pulumi.String(TemplateCMName)},
					},
					corev1.VolumeArgs{
						Name:      pulumi.String("policy"),
						ConfigMap: corev1.ConfigMapVolumeSourceArgs{Name: pulumi.String(PolicyCMName)},
					},
					corev1.VolumeArgs{
						Name:     pulumi.String("tmp"),
						EmptyDir: corev1.EmptyDirVolumeSourceArgs{SizeLimit: pulumi.String("64Mi")},
					},
					corev1.VolumeArgs{
						Name:     pulumi.String("state"),
						EmptyDir: corev1.EmptyDirVolumeSourceArgs{SizeLimit: pulumi.String("16Mi")},
					},
				},
				ImagePullSecrets: pullSecrets(a.ImagePullSecrets),
			},
		},
	}
}

// ReadinessService is the gRPC health service the manager's readiness probe asks for: the
// Manager API's, SERVING once the warm pool has first held a ready sandbox.
const ReadinessService = "fusebox.manager.v1.Manager"

// Where an agent pod mounts its manager token (see AgentTokenVolume).
const (
	AgentTokenVolumeName = "fusebox-token"
	AgentTokenMountPath  = "/var/run/secrets/fusebox"
	AgentTokenPath       = AgentTokenMountPath + "/token"
	agentTokenSeconds    = 3600
)

// AgentTokenVolume is the projected ServiceAccount token volume an agent pod mounts at
// AgentTokenMountPath to call the manager: the pod's ServiceAccount token with the manager's
// audience, rotated by the kubelet (the SDK reads it again when it changes). Point
// $FUSEBOX_TOKEN_FILE at AgentTokenPath.
func AgentTokenVolume(audience string) corev1.VolumeArgs {
	return corev1.VolumeArgs{
		Name: pulumi.String(AgentTokenVolumeName),
		Projected: corev1.ProjectedVolumeSourceArgs{Sources: corev1.VolumeProjectionArray{corev1.VolumeProjectionArgs{
			ServiceAccountToken: corev1.ServiceAccountTokenProjectionArgs{
				Audience: pulumi.String(or(audience, DefaultTokenAudience)), ExpirationSeconds: pulumi.Int(agentTokenSeconds), Path: pulumi.String("token"),
			},
		}}},
	}
}
