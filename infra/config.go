package infra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/cilium"
	"github.com/fusebox-dev/fusebox/components/gvisor"
	"github.com/fusebox-dev/fusebox/components/karpenter"
	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/infra/preflight"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Namespace is the configuration namespace of every key: "fusebox:cloud", "fusebox:images", ...
const Namespace = "fusebox"

// Config is the typed stack configuration. Every key lives under "fusebox:"; objects are
// decoded strictly, so a misspelt field fails the preview naming the key and the stack file.
type Config struct {
	// Cloud (required): eks, gke, aks or local.
	Cloud components.Cloud `json:"-"`
	// Registry (optional): HOST[:PORT]/PATH the stack pulls its images from; `fusebox
	// release` writes it, and promotion keeps it (a prod mirror is never replaced by dev's).
	Registry string `json:"-"`
	// Images (required): manager and sandbox images, by digest, as `fusebox release` writes
	// them.
	Images Images `json:"images"`
	// Namespaces (optional): defaults fusebox-system and fusebox-sandboxes.
	Namespaces Namespaces `json:"namespaces"`
	// Manager (optional): replicas and placement of the manager.
	Manager ManagerConfig `json:"manager"`
	// Pool (required): warm pool sizes and each sandbox's resources.
	Pool PoolConfig `json:"pool"`
	// NodePool (required on eks and aks; optional on gke): the sandbox node pool.
	NodePool NodePoolConfig `json:"nodePool"`
	// GVisor (optional): where nodes download runsc from.
	GVisor GVisorConfig `json:"gvisor"`
	// Cilium (required): install it or use the cluster's own.
	Cilium CiliumConfig `json:"cilium"`
	// Egress (required): where the agents run (their pods reach their sandboxes' data port).
	Egress EgressConfig `json:"egress"`
	// Access (optional): who may allocate, which templates, which egress ceiling (the
	// manager API's authorisation policy). Default: every ServiceAccount of
	// egress.dataClientNamespaces, any template, no egress.
	Access []AccessRule `json:"-"`
	// Operators (optional): ServiceAccounts ("namespace/name") that see every tenant's
	// sandboxes in List.
	Operators []string `json:"-"`
	// NetworkPolicy (optional) is the cluster's network policy flavour: cilium (default on
	// eks and aks), gke (default and only choice on gke: NetworkPolicy + FQDNNetworkPolicy) or
	// kubernetes (default on local: plain NetworkPolicy; egress allowlists take IPs only).
	NetworkPolicy sandboxnet.Flavour `json:"-"`
	// InVPC (optional): no rendered object may name a host outside PrivateHosts.
	InVPC        bool     `json:"-"`
	PrivateHosts []string `json:"-"`
	// ImagePullSecrets (optional) name Secrets that must exist in the manager and sandbox
	// namespaces (and kube-system, for the node installer) before `fusebox up`.
	ImagePullSecrets []string `json:"-"`
	// Templates (optional): sandbox templates besides the default, each with its own image
	// (pinned by digest), limits, environment, user and warm pool (docs/templates.md), in the
	// schema of the manager's templates file.
	Templates []templates.Spec `json:"-"`
	// ClusterDNS (optional, default kube-dns) is where the cluster's pods send DNS queries,
	// and so where a sandbox allowed names may send them (port 53 only): kube-dns,
	// nodelocaldns (NodeLocal DNSCache), gke-clouddns (GKE Cloud DNS, gke only) or
	// aks-localdns (AKS LocalDNS, aks only). Preflight checks it against the cluster.
	ClusterDNS sandboxnet.ClusterDNS `json:"-"`
}

// AccessRule is one rule of the manager API's authorisation policy (fusebox:access): the
// callers (every ServiceAccount of namespaces, and serviceAccounts as "namespace/name"), the
// templates they may use (empty: all) and the ceiling of their egress allowlists (empty:
// none).
type AccessRule = auth.RuleFile

// Images are the digest-pinned images of an installation.
type Images struct {
	Manager string `json:"manager"`
	Sandbox string `json:"sandbox"`
}

// Namespaces name the manager's and the sandboxes' namespaces.
type Namespaces struct {
	Manager string `json:"manager"`
	Sandbox string `json:"sandbox"`
	// Create (default true) makes the stack create both namespaces; false uses existing ones
	// (made beforehand, e.g. to hold the image pull secrets).
	Create *bool `json:"create"`
}

// CreateNamespaces reports whether the stack creates the namespaces.
func (n Namespaces) CreateNamespaces() bool { return n.Create == nil || *n.Create }

// ManagerConfig configures the manager Deployment.
type ManagerConfig struct {
	Replicas             int    `json:"replicas"`
	RequiredAntiAffinity bool   `json:"requiredAntiAffinity"`
	ServiceType          string `json:"serviceType"`
	CPU                  string `json:"cpu"`
	Memory               string `json:"memory"`
	// SkipAwait: do not wait for the manager to become ready (test control planes only).
	SkipAwait bool `json:"skipAwait"`
	// NodesAutoscaled: a node autoscaler adds nodes for the manager's pending pods, so
	// preflight does not count the nodes a rollout needs.
	NodesAutoscaled bool `json:"nodesAutoscaled"`
	// TLSSecret, TokenAudience and ExternalNames secure the API: see checkManagerAPI.
	TLSSecret     string   `json:"tlsSecret"`
	TokenAudience string   `json:"tokenAudience"`
	ExternalNames []string `json:"externalNames"`
}

// PoolConfig sizes the warm pool and each sandbox.
type PoolConfig struct {
	Size      int    `json:"size"`
	Max       int    `json:"max"`
	Estimator string `json:"estimator"`
	// SandboxCPU is each sandbox's CPU request, a weight; SandboxCPULimit an optional CFS
	// quota of at least that (none by default: a quota stalls gVisor's bursts).
	SandboxCPU      string `json:"sandboxCPU"`
	SandboxCPULimit string `json:"sandboxCPULimit"`
	SandboxMemory   string `json:"sandboxMemory"`
}

// NodePoolConfig configures the sandbox node pool (Karpenter on eks/aks; on gke only the name
// of the GKE Sandbox node pool created with the cluster).
type NodePoolConfig struct {
	Name             string                  `json:"name"`
	CPULimit         string                  `json:"cpuLimit"`
	MemoryLimit      string                  `json:"memoryLimit"`
	Requirements     []karpenter.Requirement `json:"requirements"`
	ConsolidateAfter string                  `json:"consolidateAfter"`
	DisruptionBudget string                  `json:"disruptionBudget"`
	DriftBudget      string                  `json:"driftBudget"`
	ExpireAfter      string                  `json:"expireAfter"`
	EC2              *EC2Config              `json:"ec2"`
	AKS              *AKSConfig              `json:"aks"`
	GKENodePool      string                  `json:"gkeNodePool"`
}

// EC2Config configures the EC2NodeClass.
type EC2Config struct {
	Role                      string            `json:"role"`
	AMIAlias                  string            `json:"amiAlias"`
	AMIID                     string            `json:"amiID"`
	SubnetSelectorTags        map[string]string `json:"subnetSelectorTags"`
	SecurityGroupSelectorTags map[string]string `json:"securityGroupSelectorTags"`
	VolumeSize                string            `json:"volumeSize"`
	Tags                      map[string]string `json:"tags"`
}

// AKSConfig configures the AKSNodeClass.
type AKSConfig struct {
	ImageFamily  string            `json:"imageFamily"`
	OSDiskSizeGB int               `json:"osDiskSizeGB"`
	VNETSubnetID string            `json:"vnetSubnetID"`
	Tags         map[string]string `json:"tags"`
}

// GVisorConfig says which gVisor release nodes install and where they get it: on eks the
// userData downloads a release (from a mirror for in-VPC installs); on aks the node installer
// installs the runsc and shim its image carries, checked against the digests recorded in the
// image at build, so aks takes neither a release nor a download URL.
type GVisorConfig struct {
	// BinaryBaseURL serves <arch>/runsc; with Version it is the releases root (default
	// gVisor's bucket) and the binaries come from <binaryBaseURL>/<version>/<arch>/runsc.
	// Environment-specific: promotion leaves it alone. eks only.
	BinaryBaseURL string `json:"binaryBaseURL"`
	// Version is the gVisor release (e.g. "20250120"). Release-defining: promoted. eks only.
	Version string `json:"version"`
	// InstallerImage is the gvisor-installer image of `fusebox image build` (by digest), which
	// runs the node installer. Required on eks and aks; on aks it also carries runsc.
	InstallerImage string `json:"installerImage"`
}

// baseURL is where nodes download <arch>/runsc from.
func (g GVisorConfig) baseURL() string {
	if g.Version == "" {
		return orDefault(g.BinaryBaseURL, gvisor.DefaultBinaryBaseURL)
	}
	return strings.TrimRight(orDefault(g.BinaryBaseURL, gvisor.ReleasesURL), "/") + "/" + g.Version
}

var gvisorVersion = regexp.MustCompile(`^[0-9]{8}(\.[0-9]+)?$`)

// CiliumConfig installs Cilium from a chart source, or uses the cluster's own.
type CiliumConfig struct {
	Install bool        `json:"install"`
	Chart   ChartConfig `json:"chart"`
	// Images override the chart's images (by digest), e.g. with an in-VPC mirror's copies.
	Images cilium.Images `json:"images"`
}

// ChartConfig is a chart repository with a pinned version, or a local chart path.
type ChartConfig struct {
	Repo    string `json:"repo"`
	Name    string `json:"name"`
	Version string `json:"version"`
	Path    string `json:"path"`
}

// EgressConfig says who reaches the sandboxes' data port: the agents' pods (labelled
// AgentLabels, default fusebox.dev/agent=true) in DataClientNamespaces, and DataClientCIDRs.
// A sandbox's egress is its allocation's allowlist only: there are no installation-wide
// egress defaults (AllowCIDRs and AllowFQDNs are refused).
type EgressConfig struct {
	AllowCIDRs           []string          `json:"allowCIDRs"`
	AllowFQDNs           []string          `json:"allowFQDNs"`
	DataClientNamespaces []string          `json:"dataClientNamespaces"`
	DataClientCIDRs      []string          `json:"dataClientCIDRs"`
	AgentLabels          map[string]string `json:"agentLabels"`
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("stack configuration")

// LoadConfig reads and validates the stack's configuration. Errors name the key and the stack
// file (stacks/Pulumi.<stack>.yaml).
func LoadConfig(ctx *pulumi.Context) (*Config, error) {
	return loadConfig(config.New(ctx, Namespace), ctx.Stack())
}

// configReader is the part of Pulumi's config.Config LoadConfig reads through: Try returns a
// key's value (objects as JSON) or an error when it is not set.
type configReader interface {
	Try(key string) (string, error)
}

// fileConfig is a stack file's fusebox: keys, as the Pulumi engine hands them to a program.
type fileConfig map[string]string

func (f fileConfig) Try(key string) (string, error) {
	v, ok := f[Namespace+":"+key]
	if !ok {
		return "", fmt.Errorf("missing required configuration variable '%s:%s'", Namespace, key)
	}
	return v, nil
}

// LoadStackFile reads and validates a stack file (stacks/Pulumi.<stack>.yaml) the way
// LoadConfig reads the same configuration inside a Pulumi program: strings as they are, other
// scalars printed, lists and objects as JSON.
func LoadStackFile(path, stack string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading stack file: %w", err)
	}
	var f struct {
		Config map[string]any `json:"config"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cfg := fileConfig{}
	for k, v := range f.Config {
		switch v := v.(type) {
		case string:
			cfg[k] = v
		case bool, float64:
			cfg[k] = fmt.Sprint(v)
		default:
			j, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, k, err)
			}
			cfg[k] = string(j)
		}
	}
	return loadConfig(cfg, stack)
}

// managerMaxSurge is how many pods the manager's rollout starts before it stops an old one
// (components/manager's deploymentSpec: maxSurge 1, maxUnavailable 0; TestManagerRollout
// checks the rendered Deployment against it).
const managerMaxSurge = 1

// Preflight is what preflight.Check needs to know of this configuration.
func (c *Config) Preflight(stack string) preflight.Stack {
	s := preflight.Stack{
		Name: stack, Cloud: c.Cloud, Flavour: c.NetworkPolicy, CiliumInstall: c.Cilium.Install,
		ManagerNamespace: c.Namespaces.Manager, SandboxNamespace: c.Namespaces.Sandbox,
		CreateNamespaces: c.Namespaces.CreateNamespaces(), ImagePullSecrets: c.ImagePullSecrets,
		Manager: preflight.Rollout{
			Replicas: c.managerReplicas(), RequiredAntiAffinity: c.Manager.RequiredAntiAffinity,
			MaxSurge: managerMaxSurge, NodesAutoscaled: c.Manager.NodesAutoscaled,
		},
		ClusterDNS: c.ClusterDNS,
	}
	if c.Manager.SkipAwait {
		// up does not wait for the manager's rollout (test control planes that run no
		// manager pod): no node count to check.
		s.Manager = preflight.Rollout{}
	}
	if c.Cloud == components.EKS || c.Cloud == components.AKS {
		s.InstallerNamespace = gvisor.DefaultInstallerNamespace
	}
	return s
}

// failFunc makes the error for a configuration key: it wraps ErrConfig and names the key
// and the stack file.
type failFunc func(key string, err error) error

// loadConfig reads the configuration in steps, each refusing what it checks before the next
// runs, so the first error a stack file has is the one reported.
func loadConfig(cfg configReader, stack string) (*Config, error) {
	file := fmt.Sprintf("stacks/Pulumi.%s.yaml", stack)
	fail := func(key string, err error) error {
		return fmt.Errorf("%w: %s:%s in %s: %v", ErrConfig, Namespace, key, file, err)
	}
	release := fmt.Sprintf("no released image: run `fusebox release --registry HOST[:PORT]/PATH --stack %s` (it builds and pushes the images and writes their digests here)", stack)
	var c Config
	if err := c.loadCloud(cfg, fail); err != nil {
		return nil, err
	}
	if err := c.loadObjects(cfg, fail, release); err != nil {
		return nil, err
	}
	if err := c.loadPolicy(cfg, fail); err != nil {
		return nil, err
	}
	if err := c.loadTemplates(cfg, fail); err != nil {
		return nil, err
	}
	if err := c.checkImages(fail, release); err != nil {
		return nil, err
	}
	if err := c.checkSizes(fail); err != nil {
		return nil, err
	}
	if len(c.Templates) > 0 {
		// As the manager will check them, over the default template's pods (placement
		// changes nothing a template sets).
		if err := manager.CheckTemplates(c.sandboxTemplate(nil), c.Templates); err != nil {
			return nil, fail("templates", err)
		}
	}
	if err := c.Manager.checkAPI(fail); err != nil {
		return nil, err
	}
	if err := c.checkGVisor(fail, release); err != nil {
		return nil, err
	}
	if err := c.checkPrivateHosts(fail); err != nil {
		return nil, err
	}
	return &c, nil
}

// loadCloud reads the cloud (required) and the registry the images are pulled from.
func (c *Config) loadCloud(cfg configReader, fail failFunc) error {
	cloud, err := cfg.Try("cloud")
	if err != nil {
		return fail("cloud", errors.New("required (eks, gke, aks or local)"))
	}
	if c.Cloud, err = components.ParseCloud(cloud); err != nil {
		return fail("cloud", err)
	}
	if r, err := cfg.Try("registry"); err == nil {
		c.Registry = strings.TrimSuffix(r, "/")
		if host, path, ok := strings.Cut(c.Registry, "/"); !ok || host == "" || path == "" || strings.ContainsAny(c.Registry, "@ ") {
			return fail("registry", fmt.Errorf("%q: want HOST[:PORT]/PATH (the repository path the images are under)", r))
		}
	}
	return nil
}

// loadObjects decodes the structured keys strictly (a misspelt field is refused), refusing
// a missing required one.
func (c *Config) loadObjects(cfg configReader, fail failFunc, release string) error {
	objects := []struct {
		key      string
		required bool
		into     any
	}{
		{"images", true, &c.Images},
		{"pool", true, &c.Pool},
		{"cilium", true, &c.Cilium},
		{"namespaces", false, &c.Namespaces},
		{"manager", false, &c.Manager},
		{"nodePool", c.Cloud == components.EKS || c.Cloud == components.AKS, &c.NodePool},
		{"gvisor", false, &c.GVisor},
		{"egress", true, &c.Egress},
		{"privateHosts", false, &c.PrivateHosts},
		{"imagePullSecrets", false, &c.ImagePullSecrets},
		{"access", false, &c.Access},
		{"operators", false, &c.Operators},
	}
	for _, o := range objects {
		raw, err := cfg.Try(o.key)
		if err != nil {
			if o.key == "images" {
				return fail("images.manager", errors.New(release))
			}
			if o.required {
				return fail(o.key, fmt.Errorf("required on %s", c.Cloud))
			}
			continue
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(o.into); err != nil {
			want := "an object"
			if _, list := o.into.(*[]string); list {
				want = "a list of strings"
			}
			return fail(o.key, fmt.Errorf("want %s: %v", want, err))
		}
	}
	return nil
}

// loadTemplates reads the templates (fusebox:templates: a list, in the templates file's
// schema), checked as the manager checks its templates file; components/manager checks what
// a cluster cannot honour.
func (c *Config) loadTemplates(cfg configReader, fail failFunc) error {
	raw, err := cfg.Try("templates")
	if err != nil {
		return nil
	}
	if c.Templates, err = templates.ParseList([]byte(raw), Namespace+":templates"); err != nil {
		return fail("templates", err)
	}
	return nil
}

// checkImages refuses an image that is not released, or not pinned by digest.
func (c *Config) checkImages(fail failFunc, release string) error {
	for _, img := range []struct{ key, ref string }{{"images.manager", c.Images.Manager}, {"images.sandbox", c.Images.Sandbox}} {
		if img.ref == "" {
			return fail(img.key, errors.New(release))
		}
		if err := components.ValidateImage(img.ref); err != nil {
			return fail(img.key, err)
		}
	}
	return nil
}

// checkSizes defaults the namespaces and checks the pool's and the manager's sizes, the
// Cilium chart and the EC2 node class.
func (c *Config) checkSizes(fail failFunc) error {
	if c.Namespaces.Manager == "" {
		c.Namespaces.Manager = "fusebox-system"
	}
	if c.Namespaces.Sandbox == "" {
		c.Namespaces.Sandbox = "fusebox-sandboxes"
	}
	if c.Pool.Size < 0 || c.Pool.Max <= 0 || c.Pool.Max < c.Pool.Size {
		return fail("pool", fmt.Errorf("size %d, max %d: want 0 <= size <= max, max > 0", c.Pool.Size, c.Pool.Max))
	}
	if c.Manager.Replicas != 0 && c.Manager.Replicas < 2 {
		return fail("manager.replicas", fmt.Errorf("%d: at least 2", c.Manager.Replicas))
	}
	if c.Cilium.Install && c.Cilium.Chart.Path == "" && (c.Cilium.Chart.Repo == "" || c.Cilium.Chart.Version == "") {
		return fail("cilium.chart", errors.New("install needs path, or repo and a pinned version"))
	}
	if c.Cilium.Install && c.Cilium.Chart.Version != "" {
		v, err := preflight.ParseVersion(c.Cilium.Chart.Version)
		if err != nil {
			return fail("cilium.chart.version", err)
		}
		if v.Less(preflight.MinCiliumVersion) {
			return fail("cilium.chart.version", fmt.Errorf("%s: fusebox needs Cilium %s or later (enableDefaultDeny in CiliumNetworkPolicy, which an older CRD prunes from the default deny)", c.Cilium.Chart.Version, preflight.MinCiliumVersion))
		}
	}
	if c.Cloud == components.EKS && c.NodePool.EC2 == nil {
		return fail("nodePool.ec2", errors.New("required on eks"))
	}
	for _, b := range []struct{ key, v string }{{"nodePool.disruptionBudget", c.NodePool.DisruptionBudget}, {"nodePool.driftBudget", c.NodePool.DriftBudget}} {
		if b.v != "" {
			if err := karpenter.ValidateBudget(b.v); err != nil {
				return fail(b.key, err)
			}
		}
	}
	return nil
}

// checkGVisor checks where nodes get gVisor from and, per cloud, what installs it: on eks a
// pinned AMI and the verify-only installer's image; on aks the installer's image alone, which
// carries runsc (a release or download URL there would be ignored, so it is refused).
func (c *Config) checkGVisor(fail failFunc, release string) error {
	if c.GVisor.BinaryBaseURL != "" && !strings.HasPrefix(c.GVisor.BinaryBaseURL, "http") {
		return fail("gvisor.binaryBaseURL", fmt.Errorf("%q: want an http(s) URL", c.GVisor.BinaryBaseURL))
	}
	if c.GVisor.Version != "" && !gvisorVersion.MatchString(c.GVisor.Version) {
		return fail("gvisor.version", fmt.Errorf("%q: want a release such as \"20250120\" (quoted)", c.GVisor.Version))
	}
	if c.Cloud == components.EKS && c.GVisor.InstallerImage == "" {
		// The verify-only node installer removes the startup taint once runsc is registered.
		return fail("gvisor.installerImage", errors.New("required on eks (the node installer's image, by digest: it removes a node's startup taint once the userData's runsc is registered with containerd)"))
	}
	if c.Cloud == components.EKS {
		if err := karpenter.ValidateAMI(c.NodePool.EC2.AMIAlias, c.NodePool.EC2.AMIID); err != nil {
			return fail("nodePool.ec2.amiAlias", err)
		}
	}
	if c.Cloud == components.AKS {
		// AKS nodes install the runsc and shim of the node installer's image, checked against
		// the digests `fusebox image build` recorded in it: nothing is downloaded.
		if c.GVisor.InstallerImage == "" {
			return fail("gvisor.installerImage", fmt.Errorf("required on aks (the node installer's image, by digest, which carries runsc): %s", release))
		}
		for _, k := range []struct{ key, v string }{{"gvisor.binaryBaseURL", c.GVisor.BinaryBaseURL}, {"gvisor.version", c.GVisor.Version}} {
			if k.v != "" {
				return fail(k.key, errors.New("not used on aks: the node installer installs the runsc and containerd-shim-runsc-v1 of its image (gvisor.installerImage); remove it"))
			}
		}
	}
	if c.GVisor.InstallerImage != "" {
		if err := components.ValidateImage(c.GVisor.InstallerImage); err != nil {
			return fail("gvisor.installerImage", err)
		}
	}
	return nil
}

// checkPrivateHosts, with inVPC, refuses any host outside privateHosts.
func (c *Config) checkPrivateHosts(fail failFunc) error {
	if !c.InVPC {
		return nil
	}
	if len(c.PrivateHosts) == 0 {
		return fail("privateHosts", errors.New("required with inVPC: true (the registry, mirror and chart hosts inside the VPC, e.g. registry.internal or *.corp.example)"))
	}
	if err := c.CheckInVPC(); err != nil {
		return fail(err.key, err.err)
	}
	return nil
}

// loadPolicy reads and checks the network policy flavour, the agents, the in-VPC switch and
// the image pull secrets.
func (c *Config) loadPolicy(cfg configReader, fail failFunc) error {
	defaults := map[components.Cloud]sandboxnet.Flavour{
		components.EKS: sandboxnet.Cilium, components.AKS: sandboxnet.Cilium,
		components.GKE: sandboxnet.GKE, components.Local: sandboxnet.Kubernetes,
	}
	c.NetworkPolicy = defaults[c.Cloud]
	if v, err := cfg.Try("networkPolicy"); err == nil {
		f, err := sandboxnet.ParseFlavour(v)
		if err != nil {
			return fail("networkPolicy", err)
		}
		c.NetworkPolicy = f
	}
	switch {
	case c.Cloud == components.GKE && c.NetworkPolicy != sandboxnet.GKE:
		return fail("networkPolicy", fmt.Errorf("%s on gke: GKE Dataplane V2 serves no namespaced CiliumNetworkPolicy; use gke (NetworkPolicy + FQDNNetworkPolicy)", c.NetworkPolicy))
	case c.Cloud != components.GKE && c.NetworkPolicy == sandboxnet.GKE:
		return fail("networkPolicy", fmt.Errorf("gke on %s: FQDNNetworkPolicy exists on GKE only", c.Cloud))
	}
	if err := c.loadClusterDNS(cfg, fail); err != nil {
		return err
	}
	if v, err := cfg.Try("inVPC"); err == nil {
		switch v {
		case "true":
			c.InVPC = true
		case "false":
		default:
			return fail("inVPC", fmt.Errorf("%q: want true or false", v))
		}
	}
	if len(c.Egress.AllowCIDRs) > 0 || len(c.Egress.AllowFQDNs) > 0 {
		return fail("egress.allowFQDNs", errors.New("installation-wide egress defaults are gone: a warm sandbox reaches nothing and a bound one exactly its allocation's allowlist; pass destinations with each allocation (and remove egress.allowFQDNs and egress.allowCIDRs)"))
	}
	if len(c.Egress.DataClientNamespaces) == 0 && len(c.Egress.DataClientCIDRs) == 0 {
		return fail("egress.dataClientNamespaces", errors.New("required: the namespaces where agents run (their pods labelled fusebox.dev/agent=true reach their sandboxes' data port), or dataClientCIDRs"))
	}
	for _, ns := range c.Egress.DataClientNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fail("egress.dataClientNamespaces", fmt.Errorf("%q: %s", ns, strings.Join(errs, "; ")))
		}
	}
	if c.Access == nil {
		c.Access = []AccessRule{{Namespaces: c.Egress.DataClientNamespaces}}
	}
	for i, r := range c.Access {
		if len(r.Namespaces) == 0 && len(r.ServiceAccounts) == 0 {
			return fail(fmt.Sprintf("access[%d]", i), errors.New("names no caller: give namespaces or serviceAccounts (namespace/name)"))
		}
	}
	if _, err := auth.NewPolicy(auth.PolicyFile{Rules: c.Access, Operators: c.Operators}); err != nil {
		return fail("access", err)
	}
	for _, s := range c.ImagePullSecrets {
		if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
			return fail("imagePullSecrets", fmt.Errorf("%q: %s", s, strings.Join(errs, "; ")))
		}
	}
	return nil
}

// managerReplicas is the manager's replica count (the component's default 2 when unset).
func (c *Config) managerReplicas() int {
	if c.Manager.Replicas == 0 {
		return 2
	}
	return c.Manager.Replicas
}

// loadClusterDNS reads where the cluster's pods send DNS queries (default kube-dns) and
// refuses a setup the stack's cloud or network policy flavour cannot have.
func (c *Config) loadClusterDNS(cfg configReader, fail failFunc) error {
	v, _ := cfg.Try("clusterDNS")
	d, err := sandboxnet.ParseClusterDNS(v)
	if err != nil {
		return fail("clusterDNS", err)
	}
	switch {
	case d == sandboxnet.GKECloudDNS && c.Cloud != components.GKE:
		return fail("clusterDNS", fmt.Errorf("%s on %s: GKE Cloud DNS exists on gke only", d, c.Cloud))
	case d == sandboxnet.AKSLocalDNS && c.Cloud != components.AKS:
		return fail("clusterDNS", fmt.Errorf("%s on %s: AKS LocalDNS exists on aks only", d, c.Cloud))
	}
	if err := sandboxnet.CheckClusterDNS(c.NetworkPolicy, d); err != nil {
		return fail("clusterDNS", err)
	}
	if d == sandboxnet.NodeLocalDNS && c.NetworkPolicy == sandboxnet.Cilium && c.Cilium.Install {
		// Under Cilium the cache must be reached through a Local Redirect Policy, which the
		// Cilium this stack installs does not enable.
		return fail("clusterDNS", errors.New("nodelocaldns with cilium.install: true: NodeLocal DNSCache under Cilium needs Cilium's Local Redirect Policy, which the Cilium fusebox installs does not enable; install Cilium yourself with it (cilium.install: false), or use kube-dns"))
	}
	c.ClusterDNS = d
	return nil
}
