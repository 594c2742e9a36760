package preflight

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
)

// DaemonSet is what the checks read of a DaemonSet.
type DaemonSet struct {
	// Images are its pod template's containers' images (init containers not included).
	Images []string
	// Args are its containers' commands and arguments, in order.
	Args []string
	// HostNetwork: its pods use the node's network namespace.
	HostNetwork bool
}

// The Cilium agent's DaemonSet (the chart's; AKS's Azure CNI powered by Cilium uses the same
// name).
const (
	CiliumAgentNamespace = "kube-system"
	CiliumAgentName      = "cilium"
)

// MinCiliumVersion is the first Cilium release whose CiliumNetworkPolicy has
// enableDefaultDeny (cilium/cilium#30572, CFP-30572 "Non-default-Deny Network Policy",
// Cilium release 1.16; its agent flag enable-non-default-deny-policies came with it). An
// older Cilium's CRD schema prunes the field from fusebox's default deny, the manager's
// exact-spec check (kubealloc.CheckDefaultDeny) then fails, and the manager refuses to
// start. FQDN policies (toFQDNs) are older (Cilium 1.2).
var MinCiliumVersion = Version{1, 16, 0}

// Version is a release's major, minor and patch numbers.
type Version [3]int

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]) }

// Less reports whether v is an older release than w.
func (v Version) Less(w Version) bool {
	for i := range v {
		if v[i] != w[i] {
			return v[i] < w[i]
		}
	}
	return false
}

var versionPrefix = regexp.MustCompile(`^v?([0-9]+)\.([0-9]+)(?:\.([0-9]+))?`)

// ParseVersion reads a release from a version or image tag: "1.16.5", "v1.16.5",
// "v1.16.5-250129" (AKS's builds), "1.17" (patch 0).
func ParseVersion(s string) (Version, error) {
	m := versionPrefix.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("%q is not a release version (want MAJOR.MINOR[.PATCH])", s)
	}
	var v Version
	for i, p := range m[1:] {
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return Version{}, fmt.Errorf("%q: %w", s, err)
		}
		v[i] = n
	}
	return v, nil
}

// imageTag returns the tag of an image reference ("repo:tag@sha256:..." -> "tag"), or "".
func imageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	slash := strings.LastIndexByte(ref, '/')
	if i := strings.LastIndexByte(ref, ':'); i > slash {
		return ref[i+1:]
	}
	return ""
}

// ciliumVersionProblems: the cluster's own Cilium (not one the stack installs, whose chart
// version the configuration checks) is at least MinCiliumVersion, read from the tag of the
// cilium-agent DaemonSet's image. Without CiliumNetworkPolicy served, flavourProblems has
// refused already.
func ciliumVersionProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	if s.Flavour != sandboxnet.Cilium || s.CiliumInstall {
		return nil, nil
	}
	served, err := c.Served(ctx, "cilium.io", "v2", "ciliumnetworkpolicies")
	if err != nil || !served {
		return nil, err
	}
	ds, err := c.DaemonSet(ctx, CiliumAgentNamespace, CiliumAgentName)
	if errors.Is(err, ErrNotFound) {
		return []string{fmt.Sprintf("Cilium's agent DaemonSet %s/%s not found: cannot read Cilium's version, which must be %s or later (enableDefaultDeny in CiliumNetworkPolicy)", CiliumAgentNamespace, CiliumAgentName, MinCiliumVersion)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading DaemonSet %s/%s: %w", CiliumAgentNamespace, CiliumAgentName, err)
	}
	for _, img := range ds.Images {
		if !strings.Contains(img, "cilium") || strings.Contains(img, "operator") {
			continue
		}
		tag := imageTag(img)
		v, err := ParseVersion(tag)
		if err != nil {
			return []string{fmt.Sprintf("Cilium's version is unknown: the agent's image %s has no version tag (%v); fusebox needs Cilium %s or later (enableDefaultDeny in CiliumNetworkPolicy)", img, err, MinCiliumVersion)}, nil
		}
		if v.Less(MinCiliumVersion) {
			return []string{fmt.Sprintf("Cilium %s is too old (agent image %s): fusebox needs %s or later, whose CiliumNetworkPolicy has enableDefaultDeny; an older CRD prunes it from fusebox's default deny (%s) and the manager refuses to start. Upgrade Cilium (on AKS, the cluster's Kubernetes version sets it: `az aks upgrade`), or set fusebox:networkPolicy: kubernetes (egress allowlists of IP addresses only) in %s",
				v, img, MinCiliumVersion, sandboxnet.DefaultDenyName, s.file())}, nil
		}
		return nil, nil
	}
	return []string{fmt.Sprintf("Cilium's version is unknown: DaemonSet %s/%s runs no cilium image (%s); fusebox needs Cilium %s or later", CiliumAgentNamespace, CiliumAgentName, strings.Join(ds.Images, ", "), MinCiliumVersion)}, nil
}
