// Package components holds the Pulumi ComponentResources that install fusebox into an existing
// Kubernetes cluster (one sub-package per concern: gvisor, karpenter, cilium, admission, manager)
// and the few facts they share: the cloud a stack targets, the labels and taint that keep sandbox
// nodes for sandboxes only, the sandbox server's ports, and digest-pinned image references.
//
// Components take typed Args and never read stack configuration: that lives in infra/.
package components

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Cloud is the environment a stack installs into. Each one needs a different node-side gVisor
// install and node class.
type Cloud string

const (
	// EKS: Karpenter with an EC2NodeClass whose userData installs runsc on AL2023 nodes.
	EKS Cloud = "eks"
	// GKE: GKE Sandbox provides gVisor and its RuntimeClass on node pools with sandboxConfig.
	GKE Cloud = "gke"
	// AKS: Karpenter (node auto-provisioning) with an AKSNodeClass.
	AKS Cloud = "aks"
	// Local: a local or test control plane; no Karpenter, no node-side install.
	Local Cloud = "local"
)

// Clouds lists every supported cloud, in the order used by error messages.
var Clouds = []Cloud{EKS, GKE, AKS, Local}

// ErrUnknownCloud is returned by ParseCloud for a value outside Clouds.
var ErrUnknownCloud = errors.New("unknown cloud")

// ParseCloud returns the Cloud named s, or an error wrapping ErrUnknownCloud.
func ParseCloud(s string) (Cloud, error) {
	for _, c := range Clouds {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w %q: want one of eks, gke, aks, local", ErrUnknownCloud, s)
}

// Names shared by the components: the sandbox node pool's label and taint (only sandbox pods
// tolerate it), the RuntimeClass, and the sandbox server's ports.
const (
	SandboxPoolLabelKey   = "fusebox.dev/pool"
	SandboxPoolLabelValue = "sandbox"
	SandboxTaintKey       = "fusebox.dev/sandbox"
	SandboxTaintValue     = "true"
	SandboxTaintEffect    = "NoSchedule"

	// RuntimeClassName is the RuntimeClass every sandbox pod must use (GKE Sandbox uses the
	// same name for its own).
	RuntimeClassName = "gvisor"
	// RuntimeHandler is the containerd runtime handler the RuntimeClass selects.
	RuntimeHandler = "runsc"

	// InitPort is the sandbox server's init listener (manager only).
	InitPort = 7070
	// DataPort is the sandbox server's data-plane listener (agents).
	DataPort = 7071

	// ManagerAppLabel is the app.kubernetes.io/name of the manager's pods, used by the network
	// policies to admit the manager to the init port.
	ManagerAppLabel = "fusebox-manager"
	// SandboxAppLabel is the app.kubernetes.io/name of sandbox pods.
	SandboxAppLabel = "fusebox-sandbox"
)

// ErrImageNotPinned is returned by ValidateImage for a reference that is not pinned by digest.
var ErrImageNotPinned = errors.New("image not pinned by digest")

var digestRef = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?@sha256:[a-f0-9]{64}$`)

// ValidateImage accepts only "repository@sha256:<64 hex>". Tags, including "repo:tag@sha256:…",
// are refused so that what runs is exactly what was reviewed in the stack file.
func ValidateImage(ref string) error {
	if !digestRef.MatchString(ref) {
		return fmt.Errorf("%w: %q: want repository@sha256:<64 hex digits>", ErrImageNotPinned, ref)
	}
	repo := ref[:strings.Index(ref, "@")]
	if strings.Contains(repo[strings.LastIndex(repo, "/")+1:], ":") {
		return fmt.Errorf("%w: %q carries a tag: use repository@sha256:<digest> only", ErrImageNotPinned, ref)
	}
	return nil
}
