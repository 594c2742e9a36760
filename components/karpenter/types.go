package karpenter

// Typed specs of the Karpenter objects this component creates: only the fields fusebox sets,
// with the CRDs' JSON names. They become untyped CustomResource input only in
// customresource.Args.

// NodePoolSpec is the spec of a karpenter.sh/v1 NodePool.
type NodePoolSpec struct {
	Template   NodeClaimTemplate `json:"template"`
	Disruption Disruption        `json:"disruption"`
	Limits     map[string]string `json:"limits,omitempty"`
	Weight     *int              `json:"weight,omitempty"`
}

// NodeClaimTemplate is the template of the NodeClaims a NodePool creates.
type NodeClaimTemplate struct {
	Metadata TemplateMetadata `json:"metadata"`
	Spec     NodeClaimSpec    `json:"spec"`
}

// TemplateMetadata are the labels and annotations given to the nodes.
type TemplateMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// NodeClaimSpec is the node shape: node class, taints, requirements and lifetime.
// StartupTaints are put on new nodes only, for a DaemonSet to remove once the node is set up;
// unlike Taints, pods need not tolerate them for Karpenter to provision nodes for them.
type NodeClaimSpec struct {
	NodeClassRef  NodeClassRef  `json:"nodeClassRef"`
	Taints        []Taint       `json:"taints,omitempty"`
	StartupTaints []Taint       `json:"startupTaints,omitempty"`
	Requirements  []Requirement `json:"requirements"`
	ExpireAfter   string        `json:"expireAfter,omitempty"`
}

// NodeClassRef names the cloud node class of a NodePool.
type NodeClassRef struct {
	Group string `json:"group"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
}

// Taint is a node taint.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// Requirement is a node selector requirement (key, operator In/NotIn/Exists/..., values).
type Requirement struct {
	Key      string   `json:"key" pulumi:"key"`
	Operator string   `json:"operator" pulumi:"operator"`
	Values   []string `json:"values,omitempty" pulumi:"values"`
}

// Disruption says when Karpenter may consolidate nodes and how many at once.
type Disruption struct {
	ConsolidationPolicy string   `json:"consolidationPolicy"`
	ConsolidateAfter    string   `json:"consolidateAfter"`
	Budgets             []Budget `json:"budgets,omitempty"`
}

// Budget caps the nodes disrupted at once ("10%" or a count), for Reasons only when set
// (Empty, Drifted, Underutilized), else for every reason.
type Budget struct {
	Nodes   string   `json:"nodes"`
	Reasons []string `json:"reasons,omitempty"`
}

// EC2NodeClassSpec is the spec of a karpenter.k8s.aws/v1 EC2NodeClass.
type EC2NodeClassSpec struct {
	Role                       string               `json:"role"`
	AMISelectorTerms           []AMISelectorTerm    `json:"amiSelectorTerms"`
	SubnetSelectorTerms        []SelectorTerm       `json:"subnetSelectorTerms"`
	SecurityGroupSelectorTerms []SelectorTerm       `json:"securityGroupSelectorTerms"`
	UserData                   string               `json:"userData,omitempty"`
	MetadataOptions            *MetadataOptions     `json:"metadataOptions,omitempty"`
	BlockDeviceMappings        []BlockDeviceMapping `json:"blockDeviceMappings,omitempty"`
	Tags                       map[string]string    `json:"tags,omitempty"`
}

// AMISelectorTerm selects the AMI: a pinned alias such as "al2023@v20250505", or an ID.
type AMISelectorTerm struct {
	Alias string `json:"alias,omitempty"`
	ID    string `json:"id,omitempty"`
}

// SelectorTerm selects subnets or security groups by tags or ID.
type SelectorTerm struct {
	Tags map[string]string `json:"tags,omitempty"`
	ID   string            `json:"id,omitempty"`
}

// MetadataOptions configure the instance metadata service of the nodes.
type MetadataOptions struct {
	HTTPEndpoint            string `json:"httpEndpoint"`
	HTTPProtocolIPv6        string `json:"httpProtocolIPv6"`
	HTTPPutResponseHopLimit int    `json:"httpPutResponseHopLimit"`
	HTTPTokens              string `json:"httpTokens"`
}

// BlockDeviceMapping is a node volume.
type BlockDeviceMapping struct {
	DeviceName string    `json:"deviceName"`
	EBS        EBSVolume `json:"ebs"`
}

// EBSVolume is the EBS volume of a BlockDeviceMapping.
type EBSVolume struct {
	VolumeSize string `json:"volumeSize"`
	VolumeType string `json:"volumeType"`
	Encrypted  bool   `json:"encrypted"`
}

// AKSNodeClassSpec is the spec of a karpenter.azure.com/v1beta1 AKSNodeClass.
type AKSNodeClassSpec struct {
	ImageFamily  string            `json:"imageFamily,omitempty"`
	OSDiskSizeGB int               `json:"osDiskSizeGB,omitempty"`
	VNETSubnetID string            `json:"vnetSubnetID,omitempty"`
	Tags         map[string]string `json:"tags,omitempty"`
}
