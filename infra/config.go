package infra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/gvisor"
	"github.com/fusebox-dev/fusebox/components/karpenter"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
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
	// Egress (optional): egress defaults and data-port clients of the sandbox namespace.
	Egress EgressConfig `json:"egress"`
}

// Images are the digest-pinned images of an installation.
type Images struct {
	Manager string `json:"manager"`
	Sandbox string `json:"sandbox"`
}

// Namespaces name the manager's and the sandboxes' namespaces.
type Namespaces struct {
	Manager string `json:"manager"`
	Sandbox string `json:"sandbox"`
}

// ManagerConfig configures the manager Deployment.
type ManagerConfig struct {
	Replicas             int    `json:"replicas"`
	RequiredAntiAffinity bool   `json:"requiredAntiAffinity"`
	ServiceType          string `json:"serviceType"`
	CPU                  string `json:"cpu"`
	Memory               string `json:"memory"`
	// SkipAwait: do not wait for the manager to become ready (test control planes only).
	SkipAwait bool `json:"skipAwait"`
}

// PoolConfig sizes the warm pool and each sandbox.
type PoolConfig struct {
	Size          int    `json:"size"`
	Max           int    `json:"max"`
	Estimator     string `json:"estimator"`
	SandboxCPU    string `json:"sandboxCPU"`
	SandboxMemory string `json:"sandboxMemory"`
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
	ExpireAfter      string                  `json:"expireAfter"`
	EC2              *EC2Config              `json:"ec2"`
	AKS              *AKSConfig              `json:"aks"`
	GKENodePool      string                  `json:"gkeNodePool"`
}

// EC2Config configures the EC2NodeClass.
type EC2Config struct {
	Role                      string            `json:"role"`
	AMIAlias                  string            `json:"amiAlias"`
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

// GVisorConfig says which gVisor release nodes install and where they get it (a mirror for
// in-VPC installs).
type GVisorConfig struct {
	// BinaryBaseURL serves <arch>/runsc; with Version it is the releases root (default
	// gVisor's bucket) and the binaries come from <binaryBaseURL>/<version>/<arch>/runsc.
	// Environment-specific: promotion leaves it alone.
	BinaryBaseURL string `json:"binaryBaseURL"`
	// Version is the gVisor release (e.g. "20250120"). Release-defining: promoted.
	Version string `json:"version"`
	// InstallerImage runs the node installer on AKS (by digest). Required on aks.
	InstallerImage string `json:"installerImage"`
	// SHA256 are the expected digests of runsc and containerd-shim-runsc-v1 per architecture
	// (x86_64, aarch64), checked by the AKS node installer. Required on aks.
	SHA256 map[string]gvisor.BinarySHA256 `json:"sha256"`
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
}

// ChartConfig is a chart repository with a pinned version, or a local chart path.
type ChartConfig struct {
	Repo    string `json:"repo"`
	Name    string `json:"name"`
	Version string `json:"version"`
	Path    string `json:"path"`
}

// EgressConfig are the sandbox namespace's egress defaults (none by default) and the clients
// allowed to reach the data port.
type EgressConfig struct {
	AllowCIDRs           []string `json:"allowCIDRs"`
	AllowFQDNs           []string `json:"allowFQDNs"`
	DataClientNamespaces []string `json:"dataClientNamespaces"`
	DataClientCIDRs      []string `json:"dataClientCIDRs"`
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("stack configuration")

// LoadConfig reads and validates the stack's configuration. Errors name the key and the stack
// file (stacks/Pulumi.<stack>.yaml).
func LoadConfig(ctx *pulumi.Context) (*Config, error) {
	file := fmt.Sprintf("stacks/Pulumi.%s.yaml", ctx.Stack())
	fail := func(key string, err error) error {
		return fmt.Errorf("%w: %s:%s in %s: %v", ErrConfig, Namespace, key, file, err)
	}
	cfg := config.New(ctx, Namespace)
	var c Config

	cloud, err := cfg.Try("cloud")
	if err != nil {
		return nil, fail("cloud", errors.New("required (eks, gke, aks or local)"))
	}
	if c.Cloud, err = components.ParseCloud(cloud); err != nil {
		return nil, fail("cloud", err)
	}

	if r, err := cfg.Try("registry"); err == nil {
		c.Registry = strings.TrimSuffix(r, "/")
		if host, path, ok := strings.Cut(c.Registry, "/"); !ok || host == "" || path == "" || strings.ContainsAny(c.Registry, "@ ") {
			return nil, fail("registry", fmt.Errorf("%q: want HOST[:PORT]/PATH (the repository path the images are under)", r))
		}
	}
	release := fmt.Sprintf("no released image: run `fusebox release --registry HOST[:PORT]/PATH --stack %s` (it builds and pushes the images and writes their digests here)", ctx.Stack())

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
		{"egress", false, &c.Egress},
	}
	for _, o := range objects {
		raw, err := cfg.Try(o.key)
		if err != nil {
			if o.key == "images" {
				return nil, fail("images.manager", errors.New(release))
			}
			if o.required {
				return nil, fail(o.key, fmt.Errorf("required on %s", c.Cloud))
			}
			continue
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(o.into); err != nil {
			return nil, fail(o.key, fmt.Errorf("want an object: %v", err))
		}
	}

	for _, img := range []struct{ key, ref string }{{"images.manager", c.Images.Manager}, {"images.sandbox", c.Images.Sandbox}} {
		if img.ref == "" {
			return nil, fail(img.key, errors.New(release))
		}
		if err := components.ValidateImage(img.ref); err != nil {
			return nil, fail(img.key, err)
		}
	}
	if c.Namespaces.Manager == "" {
		c.Namespaces.Manager = "fusebox-system"
	}
	if c.Namespaces.Sandbox == "" {
		c.Namespaces.Sandbox = "fusebox-sandboxes"
	}
	if c.Pool.Size < 0 || c.Pool.Max <= 0 || c.Pool.Max < c.Pool.Size {
		return nil, fail("pool", fmt.Errorf("size %d, max %d: want 0 <= size <= max, max > 0", c.Pool.Size, c.Pool.Max))
	}
	if c.Manager.Replicas != 0 && c.Manager.Replicas < 2 {
		return nil, fail("manager.replicas", fmt.Errorf("%d: at least 2", c.Manager.Replicas))
	}
	if c.Cilium.Install && c.Cilium.Chart.Path == "" && (c.Cilium.Chart.Repo == "" || c.Cilium.Chart.Version == "") {
		return nil, fail("cilium.chart", errors.New("install needs path, or repo and a pinned version"))
	}
	if c.Cloud == components.EKS && c.NodePool.EC2 == nil {
		return nil, fail("nodePool.ec2", errors.New("required on eks"))
	}
	if c.GVisor.BinaryBaseURL != "" && !strings.HasPrefix(c.GVisor.BinaryBaseURL, "http") {
		return nil, fail("gvisor.binaryBaseURL", fmt.Errorf("%q: want an http(s) URL", c.GVisor.BinaryBaseURL))
	}
	if c.GVisor.Version != "" && !gvisorVersion.MatchString(c.GVisor.Version) {
		return nil, fail("gvisor.version", fmt.Errorf("%q: want a release such as \"20250120\" (quoted)", c.GVisor.Version))
	}
	if c.Cloud == components.AKS {
		// AKS nodes install gVisor with the node-installer DaemonSet, which needs an image and
		// the digests to check the downloads against.
		if c.GVisor.InstallerImage == "" {
			return nil, fail("gvisor.installerImage", fmt.Errorf("required on aks (the node installer's image, by digest): %s", release))
		}
		if len(c.GVisor.SHA256) == 0 {
			return nil, fail("gvisor.sha256", errors.New("required on aks (SHA-256 of runsc and containerd-shim-runsc-v1 per architecture)"))
		}
	}
	for _, arch := range slices.Sorted(maps.Keys(c.GVisor.SHA256)) {
		if arch != "x86_64" && arch != "aarch64" {
			return nil, fail("gvisor.sha256."+arch, errors.New("want architecture x86_64 or aarch64"))
		}
		sums := c.GVisor.SHA256[arch]
		for _, b := range []struct{ key, sum string }{{"runsc", sums.Runsc}, {"containerd-shim-runsc-v1", sums.Shim}} {
			if !gvisor.ValidSHA256(b.sum) {
				return nil, fail("gvisor.sha256."+arch+"."+b.key, fmt.Errorf("%q: want 64 lowercase hex digits", b.sum))
			}
		}
	}
	if c.GVisor.InstallerImage != "" {
		if err := components.ValidateImage(c.GVisor.InstallerImage); err != nil {
			return nil, fail("gvisor.installerImage", err)
		}
	}
	return &c, nil
}
