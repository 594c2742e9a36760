// Package karpenter provides the Karpenter component: a karpenter.sh/v1 NodePool for sandbox
// pods only (a taint that only sandbox pods tolerate, a label they select, CPU/memory limits,
// removal of empty nodes only and disruption budgets that replace drifted nodes a few at a
// time) and the cloud's node class: an EC2NodeClass on EKS (with the gVisor
// install as userData) or an AKSNodeClass on AKS.
//
// The NodePool also gives new nodes the startup taint StartupTaintKey, which keeps sandbox pods
// off a node until components/gvisor's node installer DaemonSet has seen runsc work there and
// removed it: on AKS the DaemonSet installs runsc after the node has joined; on EKS the userData
// installs it before the kubelet starts and the DaemonSet (verify-only) checks that containerd
// has it registered. Karpenter still launches nodes for pending pods that do not tolerate a
// startup taint.
//
// The EC2NodeClass's AMI is pinned (an alias with a version, "al2023@v20250505", or an AMI ID):
// "al2023@latest" would change the node image, and with it containerd and its config, under a
// running installation.
//
// On GKE Karpenter is not used: sandbox nodes are a GKE Sandbox node pool created with the
// cluster (`gcloud container node-pools create fusebox-sandbox --sandbox type=gvisor`; node pool
// config sandboxConfig.type GVISOR). GKE labels and taints its nodes sandbox.gke.io/runtime=gvisor
// and its RuntimeClass "gvisor" gives every pod that names it the matching node selector and
// toleration, so sandbox pods land there without fusebox's own pool label and taint. The
// component then creates nothing and reports this placement in its GKENodePool output. On
// local clusters it creates nothing.
package karpenter

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/internal/customresource"
	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apiextensions"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Type is the component's type token.
const Type = "fusebox:components:Karpenter"

// API versions and kinds of the objects created.
const (
	NodePoolAPIVersion     = "karpenter.sh/v1"
	NodePoolKind           = "NodePool"
	EC2NodeClassAPIVersion = "karpenter.k8s.aws/v1"
	EC2NodeClassKind       = "EC2NodeClass"
	AKSNodeClassAPIVersion = "karpenter.azure.com/v1beta1"
	AKSNodeClassKind       = "AKSNodeClass"
)

// StartupTaintKey:StartupTaintEffect is the startup taint of EKS and AKS sandbox nodes. The gVisor node
// installer tolerates it and removes it from its node once runsc works there; a node whose
// install fails keeps it, so no sandbox pod is scheduled there. The installer's script removes
// the taint of this key with effect NoSchedule only: change both together.
const (
	StartupTaintKey    = "fusebox.dev/gvisor-not-ready"
	StartupTaintEffect = "NoSchedule"
)

// KarpenterArgs configure the Karpenter component.
type KarpenterArgs struct {
	Cloud components.Cloud `pulumi:"cloud"`
	// Name is the Kubernetes name of the NodePool and node class. Required.
	Name string `pulumi:"name"`
	// CPULimit and MemoryLimit cap the pool's total resources (e.g. "1000", "4000Gi"). Required
	// on EKS and AKS: an unbounded sandbox pool is an unbounded bill.
	CPULimit    string `pulumi:"cpuLimit"`
	MemoryLimit string `pulumi:"memoryLimit"`
	// Requirements constrain instance types, zones, capacity type, architecture.
	Requirements []Requirement `pulumi:"requirements"`
	// ConsolidateAfter is how long a node stays empty before Karpenter removes it (default
	// "5m"); DisruptionBudget caps nodes disrupted at once for any reason (default "10%");
	// DriftBudget caps drifted nodes replaced at once (default "1"). Each budget is a count or
	// a percentage of the pool's nodes.
	ConsolidateAfter string `pulumi:"consolidateAfter"`
	DisruptionBudget string `pulumi:"disruptionBudget"`
	DriftBudget      string `pulumi:"driftBudget"`
	// ExpireAfter bounds a node's lifetime (default "720h").
	ExpireAfter string `pulumi:"expireAfter"`
	// EC2 is required on EKS.
	EC2 *EC2Args `pulumi:"ec2"`
	// AKS is used on AKS (zero value: the provider's defaults).
	AKS *AKSArgs `pulumi:"aks"`
	// GKENodePool names the GKE Sandbox node pool, for the GKENodePool output.
	GKENodePool string `pulumi:"gkeNodePool"`
}

// EC2Args configure the EC2NodeClass.
type EC2Args struct {
	Role string `pulumi:"role"`
	// AMIAlias pins the AMI: "al2023@v<YYYYMMDD>" (Karpenter's alias with a version). Unless
	// AMIID is set, required; "@latest" is refused.
	AMIAlias string `pulumi:"amiAlias"`
	// AMIID selects one AMI by ID instead ("ami-..."), e.g. a hardened copy.
	AMIID                     string            `pulumi:"amiID"`
	SubnetSelectorTags        map[string]string `pulumi:"subnetSelectorTags"`
	SecurityGroupSelectorTags map[string]string `pulumi:"securityGroupSelectorTags"`
	// UserData installs gVisor; build it with gvisor.EKSUserData.
	UserData   string            `pulumi:"userData"`
	VolumeSize string            `pulumi:"volumeSize"` // default 100Gi
	Tags       map[string]string `pulumi:"tags"`
}

// AKSArgs configure the AKSNodeClass.
type AKSArgs struct {
	ImageFamily  string            `pulumi:"imageFamily"` // default AzureLinux
	OSDiskSizeGB int               `pulumi:"osDiskSizeGB"`
	VNETSubnetID string            `pulumi:"vnetSubnetID"`
	Tags         map[string]string `pulumi:"tags"`
}

// Karpenter is the sandbox node pool.
type Karpenter struct {
	pulumi.ResourceState

	// NodePoolName is the NodePool's name, or "" where none is created.
	NodePoolName pulumi.StringOutput `pulumi:"nodePoolName"`
	// NodeClassKind is EC2NodeClass, AKSNodeClass or "".
	NodeClassKind pulumi.StringOutput `pulumi:"nodeClassKind"`
	// GKENodePool describes the GKE Sandbox node pool sandboxes use, on GKE.
	GKENodePool pulumi.StringOutput `pulumi:"gkeNodePool"`
}

// ErrMissingSetting is wrapped by NewKarpenter's errors for a required setting left empty.
var ErrMissingSetting = errors.New("missing setting")

// NewKarpenter registers the component and, on EKS and AKS, the NodePool and node class.
func NewKarpenter(ctx *pulumi.Context, name string, args *KarpenterArgs, opts ...pulumi.ResourceOption) (*Karpenter, error) {
	if args == nil {
		return nil, fmt.Errorf("karpenter %s: args are required", name)
	}
	if _, err := components.ParseCloud(string(args.Cloud)); err != nil {
		return nil, fmt.Errorf("karpenter %s: %w", name, err)
	}
	uses := args.Cloud == components.EKS || args.Cloud == components.AKS
	if uses {
		if err := args.validate(); err != nil {
			return nil, fmt.Errorf("karpenter %s: %w", name, err)
		}
	}
	c := &Karpenter{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}

	var poolName, classKind, gke string
	switch args.Cloud {
	case components.EKS, components.AKS:
		classArgs, kind, err := args.nodeClass()
		if err != nil {
			return nil, fmt.Errorf("karpenter %s: %w", name, err)
		}
		class, err := apiextensions.NewCustomResource(ctx, name+"-nodeclass", classArgs, pulumi.Parent(c))
		if err != nil {
			return nil, fmt.Errorf("karpenter %s: %s: %w", name, kind, err)
		}
		poolArgs, err := customresource.Args(NodePoolAPIVersion, NodePoolKind, args.meta(), args.nodePoolSpec())
		if err != nil {
			return nil, fmt.Errorf("karpenter %s: %w", name, err)
		}
		if _, err := apiextensions.NewCustomResource(ctx, name+"-nodepool", poolArgs,
			pulumi.Parent(c), pulumi.DependsOn([]pulumi.Resource{class})); err != nil {
			return nil, fmt.Errorf("karpenter %s: NodePool: %w", name, err)
		}
		poolName, classKind = args.Name, kind
	case components.GKE:
		pool := args.GKENodePool
		if pool == "" {
			pool = "fusebox-sandbox"
		}
		gke = fmt.Sprintf("GKE Sandbox node pool %q (sandboxConfig type gvisor; its nodes are labelled and tainted sandbox.gke.io/runtime=gvisor; created with the cluster, not by this stack)", pool)
	}

	c.NodePoolName = pulumi.String(poolName).ToStringOutput()
	c.NodeClassKind = pulumi.String(classKind).ToStringOutput()
	c.GKENodePool = pulumi.String(gke).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{
		"nodePoolName":  c.NodePoolName,
		"nodeClassKind": c.NodeClassKind,
		"gkeNodePool":   c.GKENodePool,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (a *KarpenterArgs) validate() error {
	switch {
	case a.Name == "":
		return fmt.Errorf("%w: name", ErrMissingSetting)
	case a.CPULimit == "" || a.MemoryLimit == "":
		return fmt.Errorf("%w: cpuLimit and memoryLimit (the sandbox pool must be bounded)", ErrMissingSetting)
	}
	for _, b := range []struct{ name, v string }{{"disruptionBudget", a.DisruptionBudget}, {"driftBudget", a.DriftBudget}} {
		if b.v != "" {
			if err := ValidateBudget(b.v); err != nil {
				return fmt.Errorf("%s: %w", b.name, err)
			}
		}
	}
	if a.Cloud == components.EKS {
		switch {
		case a.EC2 == nil:
			return fmt.Errorf("%w: ec2 settings on eks", ErrMissingSetting)
		case a.EC2.Role == "":
			return fmt.Errorf("%w: ec2 role", ErrMissingSetting)
		case len(a.EC2.SubnetSelectorTags) == 0 || len(a.EC2.SecurityGroupSelectorTags) == 0:
			return fmt.Errorf("%w: ec2 subnet and security group selector tags", ErrMissingSetting)
		case a.EC2.UserData == "":
			return fmt.Errorf("%w: ec2 userData (the gVisor install)", ErrMissingSetting)
		}
		if err := ValidateAMI(a.EC2.AMIAlias, a.EC2.AMIID); err != nil {
			return err
		}
	}
	return nil
}

// ErrBadBudget is returned for a disruption budget Karpenter would refuse.
var ErrBadBudget = errors.New("bad disruption budget")

// budgetNodes is the pattern of a budget's nodes in Karpenter's NodePool CRD (karpenter.sh/v1
// Budget.Nodes): a count or a percentage up to 100%.
var budgetNodes = regexp.MustCompile(`^((100|[0-9]{1,2})%|[0-9]+)$`)

// ValidateBudget checks a disruption budget's nodes: a count ("1") or a percentage ("10%").
func ValidateBudget(nodes string) error {
	if !budgetNodes.MatchString(nodes) {
		return fmt.Errorf("%w: %q: want a count of nodes (\"1\") or a percentage (\"10%%\")", ErrBadBudget, nodes)
	}
	return nil
}

// ErrUnpinnedAMI is returned for an EC2NodeClass AMI that is not pinned.
var ErrUnpinnedAMI = errors.New("EC2 AMI not pinned")

var (
	amiAlias = regexp.MustCompile(`^al2023@v[0-9]{8}$`)
	amiID    = regexp.MustCompile(`^ami-[0-9a-f]{8,17}$`)
)

// ValidateAMI accepts exactly one of a versioned AL2023 alias ("al2023@v20250505") and an AMI
// ID ("ami-0123456789abcdef0"). The node userData is written for AL2023 (nodeadm).
func ValidateAMI(alias, id string) error {
	switch {
	case alias != "" && id != "":
		return fmt.Errorf("%w: set amiAlias or amiID, not both", ErrUnpinnedAMI)
	case id != "":
		if !amiID.MatchString(id) {
			return fmt.Errorf("%w: amiID %q: want ami-<hex>", ErrUnpinnedAMI, id)
		}
	case alias == "":
		return fmt.Errorf("%w: set amiAlias to a versioned AL2023 release (al2023@vYYYYMMDD) or amiID", ErrUnpinnedAMI)
	case !amiAlias.MatchString(alias):
		return fmt.Errorf("%w: amiAlias %q: want al2023@vYYYYMMDD (a pinned release; @latest would change containerd under a running installation)", ErrUnpinnedAMI, alias)
	}
	return nil
}

func (a *KarpenterArgs) meta() metav1.ObjectMetaArgs {
	return metav1.ObjectMetaArgs{
		Name:   pulumi.String(a.Name),
		Labels: pulumi.StringMap{"app.kubernetes.io/part-of": pulumi.String("fusebox")},
	}
}

func (a *KarpenterArgs) nodeClass() (*apiextensions.CustomResourceArgs, string, error) {
	if a.Cloud == components.EKS {
		e := a.EC2
		term := AMISelectorTerm{Alias: e.AMIAlias}
		if e.AMIID != "" {
			term = AMISelectorTerm{ID: e.AMIID}
		}
		spec := EC2NodeClassSpec{
			Role:                       e.Role,
			AMISelectorTerms:           []AMISelectorTerm{term},
			SubnetSelectorTerms:        []SelectorTerm{{Tags: e.SubnetSelectorTags}},
			SecurityGroupSelectorTerms: []SelectorTerm{{Tags: e.SecurityGroupSelectorTags}},
			UserData:                   e.UserData,
			// IMDSv2 with a hop limit of 1: pods (one hop further) cannot reach the node's
			// credentials even before the sandbox network policy blocks the address.
			MetadataOptions: &MetadataOptions{HTTPEndpoint: "enabled", HTTPProtocolIPv6: "disabled", HTTPPutResponseHopLimit: 1, HTTPTokens: "required"},
			BlockDeviceMappings: []BlockDeviceMapping{{
				DeviceName: "/dev/xvda",
				EBS:        EBSVolume{VolumeSize: orDefault(e.VolumeSize, "100Gi"), VolumeType: "gp3", Encrypted: true},
			}},
			Tags: e.Tags,
		}
		args, err := customresource.Args(EC2NodeClassAPIVersion, EC2NodeClassKind, a.meta(), spec)
		return args, EC2NodeClassKind, err
	}
	var z AKSArgs
	if a.AKS != nil {
		z = *a.AKS
	}
	spec := AKSNodeClassSpec{
		ImageFamily:  orDefault(z.ImageFamily, "AzureLinux"),
		OSDiskSizeGB: z.OSDiskSizeGB,
		VNETSubnetID: z.VNETSubnetID,
		Tags:         z.Tags,
	}
	args, err := customresource.Args(AKSNodeClassAPIVersion, AKSNodeClassKind, a.meta(), spec)
	return args, AKSNodeClassKind, err
}

// nodePoolSpec is the sandbox-only pool: nodes carry the pool label and the sandbox taint,
// which only pods of the gvisor RuntimeClass tolerate. On AKS, new nodes also carry the startup
// taint until the gVisor node installer removes it.
func (a *KarpenterArgs) nodePoolSpec() NodePoolSpec {
	group, kind := "karpenter.k8s.aws", EC2NodeClassKind
	if a.Cloud == components.AKS {
		group, kind = "karpenter.azure.com", AKSNodeClassKind
	}
	reqs := a.Requirements
	if len(reqs) == 0 {
		reqs = []Requirement{
			{Key: "kubernetes.io/os", Operator: "In", Values: []string{"linux"}},
			{Key: "karpenter.sh/capacity-type", Operator: "In", Values: []string{"on-demand"}},
		}
	}
	startup := []Taint{{Key: StartupTaintKey, Effect: StartupTaintEffect}}
	return NodePoolSpec{
		Template: NodeClaimTemplate{
			Metadata: TemplateMetadata{Labels: map[string]string{components.SandboxPoolLabelKey: components.SandboxPoolLabelValue}},
			Spec: NodeClaimSpec{
				NodeClassRef: NodeClassRef{Group: group, Kind: kind, Name: a.Name},
				Taints: []Taint{{
					Key: components.SandboxTaintKey, Value: components.SandboxTaintValue, Effect: components.SandboxTaintEffect,
				}},
				StartupTaints: startup,
				Requirements:  reqs,
				ExpireAfter:   orDefault(a.ExpireAfter, "720h"),
			},
		},
		Disruption: a.disruption(),
		Limits:     map[string]string{"cpu": a.CPULimit, "memory": a.MemoryLimit},
	}
}

// ConsolidationPolicy is the sandbox pool's: Karpenter removes only empty nodes.
// WhenEmptyOrUnderutilized would evict sandboxes to pack nodes, and a sandbox is a live
// session, not a replica: bound sandboxes carry karpenter.sh/do-not-disrupt (the manager sets
// it), which blocks consolidation of their node, and warm ones would be churned for nothing.
const ConsolidationPolicy = "WhenEmpty"

// DriftedReason is Karpenter's disruption reason for drifted nodes (karpenter.sh/v1
// DisruptionReason "Drifted").
const DriftedReason = "Drifted"

// disruption is the pool's disruption block. Promoting gvisor.version changes the
// EC2NodeClass's userData and promoting the AMI its amiSelectorTerms: every sandbox node
// drifts at once. The Drifted budget replaces them a few at a time (default one), so warm
// sandboxes are drained and refilled gradually; a node with bound sandboxes is not replaced
// until they end, because their do-not-disrupt blocks drift as long as the NodeClaim sets no
// terminationGracePeriod (this pool sets none; Karpenter's annotation reference:
// karpenter.sh/do-not-disrupt "blocks drift unless the NodeClaim sets a
// terminationGracePeriod"). The most restrictive budget applies, and a budget without reasons
// applies to every reason (Karpenter's NodePool disruption budgets).
func (a *KarpenterArgs) disruption() Disruption {
	return Disruption{
		ConsolidationPolicy: ConsolidationPolicy,
		ConsolidateAfter:    orDefault(a.ConsolidateAfter, "5m"),
		Budgets: []Budget{
			{Nodes: orDefault(a.DisruptionBudget, "10%")},
			{Nodes: orDefault(a.DriftBudget, "1"), Reasons: []string{DriftedReason}},
		},
	}
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}
