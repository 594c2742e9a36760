// Package manager provides the components that run fusebox's container manager in a cluster:
// Namespaces (the manager's and the sandboxes') and Manager (ServiceAccount, least-privilege
// RBAC, the sandbox pod template and the authorisation policy as ConfigMaps, TLS from a
// Secret the manager creates (or the user's) with its CA published for agents, TokenReview for
// agents' projected tokens, a Deployment of at least two replicas with
// anti-affinity, gRPC health probes and a restricted security context, a Service for the API,
// a ClusterIP Service for the metrics and a PodDisruptionBudget). Images are referenced by digest only.
package manager

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	policyv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/policy/v1"
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
	// TemplatesKey is the same ConfigMap's key holding the templates file (ManagerArgs.
	// Templates), and TemplatesPath where the manager reads it.
	TemplatesKey  = "templates.yaml"
	TemplatesPath = templateMountPath + "/" + TemplatesKey
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
	// ServiceType is the API Service's type: ClusterIP (default) or LoadBalancer. The metrics
	// have a ClusterIP Service of their own (MetricsServiceName) either way.
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
	// ExternalNames are DNS names and IP addresses agents outside the cluster reach the manager
	// by (a LoadBalancer's): the certificate the manager makes covers them beside the
	// Service's in-cluster names. Not with TLSSecret, whose names are the user's.
	ExternalNames []string `pulumi:"externalNames"`
	// Access is the authorisation policy: who may allocate, which templates, which egress
	// ceiling (see manager/auth.PolicyFile). Empty: no agent may allocate.
	Access []AccessRule `pulumi:"access"`
	// Operators are ServiceAccounts ("namespace/name") that see every tenant's sandboxes.
	Operators []string `pulumi:"operators"`
	// NetworkPolicy is the cluster's policy flavour (sandboxnet: cilium, gke or kubernetes;
	// default cilium): which per-sandbox policies the manager writes.
	NetworkPolicy string `pulumi:"networkPolicy"`
	// ClusterDNS is where the cluster's pods send DNS queries (sandboxnet.ClusterDNS; empty:
	// kube-dns, the manager's default): the peer of each bound sandbox's DNS rule.
	ClusterDNS string `pulumi:"clusterDNS"`
	// AgentNamespaces are where the agents run: their pods labelled AgentLabels (default
	// fusebox.dev/agent=true) reach their bound sandboxes' data port. AgentCIDRs reach it from
	// outside the cluster. At least one of the two is required.
	AgentNamespaces []string          `pulumi:"agentNamespaces"`
	AgentCIDRs      []string          `pulumi:"agentCIDRs"`
	AgentLabels     map[string]string `pulumi:"agentLabels"`
	// ImagePullSecrets name Secrets (in both namespaces) for pulling the manager and sandbox
	// images from a private registry.
	ImagePullSecrets []string `pulumi:"imagePullSecrets"`
	// Templates are the sandbox templates besides the default (the stack's fusebox:templates;
	// docs/templates.md): each one's pods run its image, pulled by digest, with the sandbox
	// server copied in from Sandbox.Image, and each has its own warm pool. They are checked
	// here as the manager checks them at its start (kubealloc.FromSpec over the rendered
	// sandbox template), so that `up` refuses what the manager would.
	Templates []templates.Spec `pulumi:"-"`
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
	// ErrExternalNamesWithTLSSecret: the user's certificate (TLSSecret) has the names the user
	// gave it.
	ErrExternalNamesWithTLSSecret = errors.New("external names are for the certificate the manager makes: with a TLS Secret of your own, put them in its certificate")
	ErrNoAgents                   = errors.New("agent namespaces (or agent CIDRs) are required: without them no agent can reach its sandbox")
)

// The label agents' pods carry unless AgentLabels says otherwise.
const (
	DefaultAgentLabelKey   = "fusebox.dev/agent"
	DefaultAgentLabelValue = "true"
)

// Names of the Kubernetes objects (fixed, so the manager and operators can find them).
const (
	ObjectName = "fusebox-manager"
	// MetricsServiceName is the ClusterIP Service of the manager's metrics port.
	MetricsServiceName = "fusebox-manager-metrics"
	TemplateCMName     = "fusebox-sandbox-template"
	sandboxRoleName    = "fusebox-manager-sandboxes"
	electionRoleName   = "fusebox-manager-leader-election"
	tlsRoleName        = "fusebox-manager-tls"
	removalRoleName    = "fusebox-manager-removal"
	caReaderRoleName   = "fusebox-manager-ca-reader"
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

// NewManager registers the component and its children: the ServiceAccount and its RBAC, the
// policy and sandbox-template ConfigMaps, the Deployment, its Service and its
// PodDisruptionBudget.
func NewManager(ctx *pulumi.Context, name string, args *ManagerArgs, opts ...pulumi.ResourceOption) (*Manager, error) {
	a, rendered, err := checkArgs(name, args)
	if err != nil {
		return nil, err
	}
	c := &Manager{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}
	k := newChildren(ctx, name, &a, c)
	sa, err := k.serviceAccount()
	if err != nil {
		return nil, err
	}
	rbac, err := k.rbac(sa)
	if err != nil {
		return nil, err
	}
	configs, err := k.configMaps(rendered)
	if err != nil {
		return nil, err
	}
	if err := k.deployment(rendered.configChecksums(), append(append(configs, rbac...), a.After...)); err != nil {
		return nil, err
	}
	svc, err := k.service()
	if err != nil {
		return nil, err
	}
	if err := k.metricsService(); err != nil {
		return nil, err
	}
	if err := k.disruptionBudget(); err != nil {
		return nil, err
	}
	if err := k.outputs(c, sa, svc); err != nil {
		return nil, err
	}
	return c, nil
}

// renderedArgs are the files the manager reads, rendered from its arguments.
type renderedArgs struct {
	template  string // the sandbox pod template (SandboxTemplateKey)
	policy    string // the authorisation policy (PolicyKey)
	templates string // the templates file (TemplatesKey); empty without templates
}

// checkArgs applies the defaults to a copy of args and renders the files the manager reads,
// refusing unusable arguments before anything is registered.
func checkArgs(name string, args *ManagerArgs) (ManagerArgs, renderedArgs, error) {
	if args == nil {
		return ManagerArgs{}, renderedArgs{}, fmt.Errorf("manager %s: args are required", name)
	}
	a := *args
	if err := a.defaults(); err != nil {
		return a, renderedArgs{}, fmt.Errorf("manager %s: %w", name, err)
	}
	tmpl, err := a.Sandbox.YAML()
	if err != nil {
		return a, renderedArgs{}, fmt.Errorf("manager %s: %w", name, err)
	}
	policy, err := a.policyYAML()
	if err != nil {
		return a, renderedArgs{}, fmt.Errorf("manager %s: access: %w", name, err)
	}
	specs, err := a.templatesYAML(tmpl)
	if err != nil {
		return a, renderedArgs{}, fmt.Errorf("manager %s: %w", name, err)
	}
	return a, renderedArgs{template: tmpl, policy: policy, templates: specs}, nil
}

// templatesYAML checks the templates as the manager will, over the sandbox pod template
// tmpl, and renders them as the manager's templates file (empty without templates).
func (a *ManagerArgs) templatesYAML(tmpl string) (string, error) {
	if len(a.Templates) == 0 {
		return "", nil
	}
	if err := checkTemplates(tmpl, a.Templates); err != nil {
		return "", err
	}
	b, err := yaml.Marshal(templates.File{Templates: a.Templates})
	if err != nil {
		return "", fmt.Errorf("rendering the templates: %w", err)
	}
	if _, err := templates.Parse(b); err != nil {
		return "", fmt.Errorf("the rendered templates file: %w", err)
	}
	return string(b), nil
}

// CheckTemplates checks templates specs as a manager whose sandbox pods sandbox describes
// checks them at its start: the schema (templates.Validate, errors naming the entry as
// templates[i]) and what a cluster cannot honour (kubealloc.FromSpec over the rendered pod
// template, naming the template). The stack checks them before anything is registered.
func CheckTemplates(sandbox SandboxTemplate, specs []templates.Spec) error {
	tmpl, err := sandbox.YAML()
	if err != nil {
		return err
	}
	return checkTemplates(tmpl, specs)
}

func checkTemplates(tmpl string, specs []templates.Spec) error {
	if err := templates.Validate(specs, "templates"); err != nil {
		return err
	}
	base, err := kubealloc.ParseTemplate([]byte(tmpl))
	if err != nil {
		return fmt.Errorf("the sandbox template: %w", err)
	}
	for _, spec := range specs {
		if _, err := kubealloc.FromSpec(spec, base); err != nil {
			return err
		}
	}
	return nil
}

// children registers the Manager's children: each named from the component's name, parented
// to it, and labelled (and, with SkipAwait, annotated) alike.
type children struct {
	ctx         *pulumi.Context
	name        string
	a           *ManagerArgs
	parent      pulumi.ResourceOption
	labels      pulumi.StringMap
	annotations pulumi.StringMap
}

func newChildren(ctx *pulumi.Context, name string, a *ManagerArgs, c *Manager) *children {
	k := &children{ctx: ctx, name: name, a: a, parent: pulumi.Parent(c), labels: pulumi.StringMap{
		"app.kubernetes.io/name":    pulumi.String(components.ManagerAppLabel),
		"app.kubernetes.io/part-of": pulumi.String("fusebox"),
	}}
	if a.SkipAwait {
		k.annotations = pulumi.StringMap{"pulumi.com/skipAwait": pulumi.String("true")}
	}
	return k
}

// meta is the metadata of object n in namespace ns.
func (k *children) meta(n string, ns pulumi.StringInput) metav1.ObjectMetaArgs {
	return metav1.ObjectMetaArgs{Name: pulumi.String(n), Namespace: ns, Labels: k.labels, Annotations: k.annotations}
}

// clusterMeta is the metadata of cluster-scoped object n.
func (k *children) clusterMeta(n string) metav1.ObjectMetaArgs {
	return metav1.ObjectMetaArgs{Name: pulumi.String(n), Labels: k.labels, Annotations: k.annotations}
}

// errorf wraps err with the component's name and what was being registered.
func (k *children) errorf(what string, err error) error {
	return fmt.Errorf("manager %s: %s: %w", k.name, what, err)
}

func (k *children) serviceAccount() (*corev1.ServiceAccount, error) {
	sa, err := corev1.NewServiceAccount(k.ctx, k.name+"-sa", &corev1.ServiceAccountArgs{
		Metadata: k.meta(ObjectName, k.a.Namespace),
	}, k.parent)
	if err != nil {
		return nil, k.errorf("service account", err)
	}
	return sa, nil
}

// configMaps registers the authorisation policy's and the sandbox template's ConfigMaps, which
// the Deployment mounts.
func (k *children) configMaps(r renderedArgs) ([]pulumi.Resource, error) {
	policyCM, err := corev1.NewConfigMap(k.ctx, k.name+"-policy", &corev1.ConfigMapArgs{
		Metadata: k.meta(PolicyCMName, k.a.Namespace),
		Data:     pulumi.ToStringMap(r.policyData()),
	}, k.parent)
	if err != nil {
		return nil, k.errorf("authorisation policy", err)
	}
	cm, err := corev1.NewConfigMap(k.ctx, k.name+"-sandbox-template", &corev1.ConfigMapArgs{
		Metadata: k.meta(TemplateCMName, k.a.Namespace),
		Data:     pulumi.ToStringMap(r.templateData()),
	}, k.parent)
	if err != nil {
		return nil, k.errorf("sandbox template", err)
	}
	return []pulumi.Resource{cm, policyCM}, nil
}

// Timeouts of the objects Pulumi waits for, sized for a first `up` (docs/deploy.md). The
// Deployment is ready once every replica's warm pool has held a ready sandbox: on a new
// cluster that covers a sandbox node's launch (Karpenter: a few minutes, more when capacity is
// retried), gVisor's install on it, the manager and sandbox image pulls and the pods' start.
// A rollout (one surge replica at a time, none unavailable) may need a new node per replica.
// Deleting it waits for every sandbox pod to be gone (RemovalFinalizer). A LoadBalancer
// Service waits for the cloud's load balancer.
var (
	DeploymentTimeouts   = pulumi.CustomTimeouts{Create: "20m", Update: "30m", Delete: "15m"}
	LoadBalancerTimeouts = pulumi.CustomTimeouts{Create: "15m", Update: "15m"}
)

// RemovalFinalizer keeps the manager's Deployment, once deleted, until its managers have
// removed every sandbox pod (manager/kubealloc.RemovalFinalizer, which the manager removes).
const RemovalFinalizer = "fusebox.dev/sandboxes"

// deployment registers the manager's Deployment, its pod template annotated with
// podAnnotations, after deps.
//
// Destroying it removes every sandbox before anything it waits for (the sandbox namespace's
// policies, the runtime, the manager's RBAC): Pulumi deletes the Deployment first and waits
// for it to be gone; its RemovalFinalizer keeps it, and its background deletion keeps its
// ReplicaSet and running managers, until the managers have stopped their pools and deleted
// every sandbox pod (--deployment). (Pulumi's default foreground deletion would stop the
// managers first and never see the finalizer removed.) Without a cluster that can run the
// manager (SkipAwait) nobody would remove the finalizer: it is left off.
func (k *children) deployment(podAnnotations pulumi.StringMap, deps []pulumi.Resource) error {
	meta := k.meta(ObjectName, k.a.Namespace)
	ann := pulumi.StringMap{"pulumi.com/deletionPropagationPolicy": pulumi.String("background")}
	for key, v := range k.annotations {
		ann[key] = v
	}
	meta.Annotations = ann
	if !k.a.SkipAwait {
		meta.Finalizers = pulumi.StringArray{pulumi.String(RemovalFinalizer)}
	}
	if _, err := appsv1.NewDeployment(k.ctx, k.name+"-deployment", &appsv1.DeploymentArgs{
		Metadata: meta,
		Spec:     k.a.deploymentSpec(k.labels, podAnnotations),
	}, k.parent, pulumi.DependsOn(deps), pulumi.Timeouts(&DeploymentTimeouts)); err != nil {
		return k.errorf("deployment", err)
	}
	return nil
}

// service registers the manager's Service: the gRPC API only (TLS, agents' tokens), as
// ServiceType says. The metrics port is plaintext and unauthenticated, so it is never on that
// Service, which a LoadBalancer would make public: metricsService is its own, ClusterIP.
func (k *children) service() (*corev1.Service, error) {
	opts := []pulumi.ResourceOption{k.parent}
	if k.a.ServiceType == "LoadBalancer" {
		opts = append(opts, pulumi.Timeouts(&LoadBalancerTimeouts))
	}
	svc, err := corev1.NewService(k.ctx, k.name+"-service", &corev1.ServiceArgs{
		Metadata: k.meta(ObjectName, k.a.Namespace),
		Spec: corev1.ServiceSpecArgs{
			Type:     pulumi.String(k.a.ServiceType),
			Selector: selectorLabels(),
			Ports: corev1.ServicePortArray{
				corev1.ServicePortArgs{Name: pulumi.String("grpc"), Port: pulumi.Int(k.a.GRPCPort), TargetPort: pulumi.String("grpc"), AppProtocol: pulumi.String("grpc")},
			},
		},
	}, opts...)
	if err != nil {
		return nil, k.errorf("service", err)
	}
	return svc, nil
}

// metricsService registers MetricsServiceName: the Prometheus metrics port, inside the
// cluster only (ClusterIP, whatever ServiceType is).
func (k *children) metricsService() error {
	if _, err := corev1.NewService(k.ctx, k.name+"-metrics-service", &corev1.ServiceArgs{
		Metadata: k.meta(MetricsServiceName, k.a.Namespace),
		Spec: corev1.ServiceSpecArgs{
			Type:     pulumi.String("ClusterIP"),
			Selector: selectorLabels(),
			Ports: corev1.ServicePortArray{
				corev1.ServicePortArgs{Name: pulumi.String("metrics"), Port: pulumi.Int(k.a.MetricsPort), TargetPort: pulumi.String("metrics")},
			},
		},
	}, k.parent); err != nil {
		return k.errorf("metrics service", err)
	}
	return nil
}

func (k *children) disruptionBudget() error {
	if _, err := policyv1.NewPodDisruptionBudget(k.ctx, k.name+"-pdb", &policyv1.PodDisruptionBudgetArgs{
		Metadata: k.meta(ObjectName, k.a.Namespace),
		Spec: policyv1.PodDisruptionBudgetSpecArgs{
			MinAvailable: pulumi.Int(1),
			Selector:     metav1.LabelSelectorArgs{MatchLabels: selectorLabels()},
		},
	}, k.parent); err != nil {
		return k.errorf("pod disruption budget", err)
	}
	return nil
}

// outputs sets the component's outputs and registers them.
func (k *children) outputs(c *Manager, sa *corev1.ServiceAccount, svc *corev1.Service) error {
	a := k.a
	c.Endpoint = pulumi.Sprintf("%s.%s.svc:%d", svc.Metadata.Name().Elem(), a.Namespace, a.GRPCPort)
	c.ServiceAccount = sa.Metadata.Name().Elem()
	c.Replicas = pulumi.Int(a.Replicas).ToIntOutput()
	c.TokenAudience = pulumi.String(a.TokenAudience).ToStringOutput()
	c.CAConfigMap = pulumi.String(CAConfigMapName).ToStringOutput()
	return k.ctx.RegisterResourceOutputs(c, pulumi.Map{
		"endpoint":       c.Endpoint,
		"serviceAccount": c.ServiceAccount,
		"replicas":       c.Replicas,
		"tokenAudience":  c.TokenAudience,
		"caConfigMap":    c.CAConfigMap,
	})
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
	if len(a.ExternalNames) > 0 && a.TLSSecret != "" {
		return ErrExternalNamesWithTLSSecret
	}
	for _, n := range a.ExternalNames {
		if n == "" || strings.ContainsAny(n, ", \t\n") {
			return fmt.Errorf("external name %q: a DNS name or an IP address", n)
		}
	}
	a.NetworkPolicy = or(a.NetworkPolicy, string(sandboxnet.Cilium))
	if _, err := sandboxnet.ParseFlavour(a.NetworkPolicy); err != nil {
		return err
	}
	if err := sandboxnet.CheckClusterDNS(sandboxnet.Flavour(a.NetworkPolicy), sandboxnet.ClusterDNS(a.ClusterDNS)); err != nil {
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
