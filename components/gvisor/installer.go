package gvisor

import (
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/karpenter"
	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// InstallerScript is the node installer the DaemonSet runs with bash (see node-installer.sh).
// On AKS (MODE=install): download and verify runsc and its shim, register the runtime with
// containerd (config version 2 or 3; a drop-in where the config imports a conf.d directory;
// systemd-cgroup where the kubelet uses the systemd cgroup driver), restart containerd through
// nsenter. On EKS (MODE=verify), where the userData installed it: check that runsc and its
// shim are there and registered in containerd's running configuration. Then, on both: remove
// the node's startup taint (karpenter.StartupTaintKey), label the node, and wait. A failed
// step leaves the taint, so no sandbox pod is scheduled on a node without a working runsc.
//
//go:embed node-installer.sh
var InstallerScript string

// Names of the node installer's objects and of the label it puts on nodes.
const (
	// InstallerName names the DaemonSet, its ServiceAccount and its cluster role.
	InstallerName = "fusebox-gvisor-installer"
	// DefaultInstallerNamespace is where the installer runs: a system namespace, because the
	// pod is privileged (host PID namespace, host root mounted). The sandbox namespace's
	// admission policy and the manager namespace's "restricted" Pod Security level would both
	// refuse it, rightly: it is trusted node infrastructure, not a sandbox.
	DefaultInstallerNamespace = "kube-system"
	// ReadyLabelKey=ReadyLabelValue is set on a node once runsc is installed and containerd
	// restarted with it.
	ReadyLabelKey   = "fusebox.dev/gvisor"
	ReadyLabelValue = "ready"
	// hostRoot is where the installer mounts the node's root file system.
	hostRoot = "/host"
	// readyFile is written by the script when it is done; the readiness probe checks it.
	readyFile = "/tmp/fusebox-gvisor-ready"
)

// Architectures as gVisor's release layout names them (<base>/<arch>/runsc), with the
// kubernetes.io/arch value of nodes of that architecture.
var archs = map[string]string{"x86_64": "amd64", "aarch64": "arm64"}

// BinarySHA256 are the expected SHA-256 digests (64 lowercase hex digits) of one
// architecture's binaries.
type BinarySHA256 struct {
	Runsc string `pulumi:"runsc" json:"runsc"`
	Shim  string `pulumi:"shim" json:"containerd-shim-runsc-v1"`
}

// NodeInstallerArgs configure the node-installer DaemonSet used on AKS.
type NodeInstallerArgs struct {
	// Image runs the script: it needs bash, curl, coreutils (sha256sum, install) and nsenter
	// (util-linux). By digest. Required.
	Image string `pulumi:"image"`
	// BinaryBaseURL serves <arch>/runsc and <arch>/containerd-shim-runsc-v1 (gVisor's
	// release layout; an in-VPC mirror of it). Required.
	BinaryBaseURL string `pulumi:"binaryBaseURL"`
	// SHA256 holds the expected digests per architecture ("x86_64", "aarch64"). The DaemonSet
	// runs only on nodes of the architectures listed. Required.
	SHA256 map[string]BinarySHA256 `pulumi:"sha256"`
	// Namespace is where the DaemonSet runs (default kube-system).
	Namespace string `pulumi:"namespace"`
	// VerifyOnly (EKS, whose userData installs gVisor before the kubelet starts) downloads
	// nothing: the installer checks that runsc and its shim are on the node and registered in
	// containerd's running configuration, then removes the startup taint. BinaryBaseURL and
	// SHA256 are then not used (and refused).
	VerifyOnly bool `pulumi:"verifyOnly"`
	// ImagePullSecrets name Secrets in Namespace for pulling Image from a private registry.
	ImagePullSecrets []string `pulumi:"imagePullSecrets"`
}

// ErrBadInstaller is wrapped by NewGVisor's errors for unusable NodeInstallerArgs.
var ErrBadInstaller = errors.New("bad gVisor node installer settings")

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ValidSHA256 reports whether s is a SHA-256 digest as the installer checks it: 64 lowercase
// hex digits.
func ValidSHA256(s string) bool { return sha256Hex.MatchString(s) }

// validateBaseURL accepts an absolute http(s) URL without quote, space or shell characters
// (it is quoted into shell scripts) and returns it without a trailing slash.
func validateBaseURL(raw string) (string, error) {
	base := strings.TrimRight(raw, "/")
	u, err := url.Parse(base)
	switch {
	case base == "":
		return "", fmt.Errorf("%w: empty", ErrBadBinaryURL)
	case err != nil:
		return "", fmt.Errorf("%w: %v", ErrBadBinaryURL, err)
	case u.Scheme != "https" && u.Scheme != "http", u.Host == "":
		return "", fmt.Errorf("%w: %q is not an absolute http(s) URL", ErrBadBinaryURL, base)
	case strings.ContainsAny(base, "'\"`$\\ \t\r\n"):
		return "", fmt.Errorf("%w: %q contains quote, space or shell characters", ErrBadBinaryURL, base)
	}
	return base, nil
}

// validate checks a and returns the base URL to use.
func (a *NodeInstallerArgs) validate() (string, error) {
	if err := components.ValidateImage(a.Image); err != nil {
		return "", fmt.Errorf("%w: image: %w", ErrBadInstaller, err)
	}
	if a.VerifyOnly {
		if a.BinaryBaseURL != "" || len(a.SHA256) > 0 {
			return "", fmt.Errorf("%w: a verify-only installer downloads nothing (no binaryBaseURL or sha256)", ErrBadInstaller)
		}
		return "", nil
	}
	base, err := validateBaseURL(a.BinaryBaseURL)
	if err != nil {
		return "", err
	}
	if len(a.SHA256) == 0 {
		return "", fmt.Errorf("%w: no SHA-256 digests of runsc and containerd-shim-runsc-v1", ErrBadInstaller)
	}
	for arch, sums := range a.SHA256 {
		if _, ok := archs[arch]; !ok {
			return "", fmt.Errorf("%w: sha256: architecture %q: want x86_64 or aarch64", ErrBadInstaller, arch)
		}
		for bin, sum := range map[string]string{"runsc": sums.Runsc, "containerd-shim-runsc-v1": sums.Shim} {
			if !sha256Hex.MatchString(sum) {
				return "", fmt.Errorf("%w: sha256.%s.%s %q: want 64 lowercase hex digits", ErrBadInstaller, arch, bin, sum)
			}
		}
	}
	return base, nil
}

// InstallerTimeouts bound Pulumi's wait for the installer DaemonSet (docs/deploy.md). On a
// first `up` it waits for the installer on the sandbox nodes that exist (none yet on a new
// cluster: ready at once); an update rolls it one node at a time, each pulling the image,
// installing or checking runsc and restarting containerd.
var InstallerTimeouts = pulumi.CustomTimeouts{Create: "15m", Update: "30m", Delete: "10m"}

// newNodeInstaller creates the installer's ServiceAccount, its cluster role (get and patch
// nodes: it reads the node it runs on, removes its startup taint and labels it) and binding,
// and the DaemonSet. The DaemonSet runs only on sandbox nodes (the pool's label, the sandbox
// taint tolerated) of the architectures with configured digests, and tolerates the startup
// taint that the Karpenter NodePool puts on new sandbox nodes on AKS, which it removes.
func newNodeInstaller(ctx *pulumi.Context, name string, a *NodeInstallerArgs, base string, parent pulumi.Resource) (*appsv1.DaemonSet, error) {
	sa, binding, err := installerRBAC(ctx, name, a, parent)
	if err != nil {
		return nil, err
	}
	ds, err := appsv1.NewDaemonSet(ctx, name+"-installer", &appsv1.DaemonSetArgs{
		Metadata: a.meta(true),
		Spec: appsv1.DaemonSetSpecArgs{
			Selector: metav1.LabelSelectorArgs{MatchLabels: pulumi.StringMap{
				"app.kubernetes.io/name": pulumi.String(InstallerName),
			}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategyArgs{Type: pulumi.String("RollingUpdate")},
			Template: corev1.PodTemplateSpecArgs{
				Metadata: metav1.ObjectMetaArgs{Labels: installerLabels()},
				Spec:     a.podSpec(sa.Metadata.Name().Elem(), base),
			},
		},
	}, pulumi.Parent(parent), pulumi.DependsOn([]pulumi.Resource{binding}), pulumi.Timeouts(&InstallerTimeouts))
	if err != nil {
		return nil, fmt.Errorf("installer DaemonSet: %w", err)
	}
	return ds, nil
}

// namespace is where the installer runs.
func (a *NodeInstallerArgs) namespace() string {
	if a.Namespace == "" {
		return DefaultInstallerNamespace
	}
	return a.Namespace
}

func installerLabels() pulumi.StringMap {
	return pulumi.StringMap{
		"app.kubernetes.io/name":    pulumi.String(InstallerName),
		"app.kubernetes.io/part-of": pulumi.String("fusebox"),
	}
}

// meta is the metadata of the installer's objects (in its namespace, or cluster-scoped).
func (a *NodeInstallerArgs) meta(namespaced bool) metav1.ObjectMetaArgs {
	m := metav1.ObjectMetaArgs{Name: pulumi.String(InstallerName), Labels: installerLabels()}
	if namespaced {
		m.Namespace = pulumi.String(a.namespace())
	}
	return m
}

// installerRBAC registers the installer's ServiceAccount, and the cluster role that lets it
// get and patch nodes bound to it.
func installerRBAC(ctx *pulumi.Context, name string, a *NodeInstallerArgs, parent pulumi.Resource) (*corev1.ServiceAccount, *rbacv1.ClusterRoleBinding, error) {
	sa, err := corev1.NewServiceAccount(ctx, name+"-installer-sa", &corev1.ServiceAccountArgs{
		Metadata: a.meta(true),
	}, pulumi.Parent(parent))
	if err != nil {
		return nil, nil, fmt.Errorf("installer ServiceAccount: %w", err)
	}
	role, err := rbacv1.NewClusterRole(ctx, name+"-installer-role", &rbacv1.ClusterRoleArgs{
		Metadata: a.meta(false),
		Rules: rbacv1.PolicyRuleArray{rbacv1.PolicyRuleArgs{
			ApiGroups: pulumi.StringArray{pulumi.String("")},
			Resources: pulumi.StringArray{pulumi.String("nodes")},
			Verbs:     pulumi.StringArray{pulumi.String("get"), pulumi.String("patch")},
		}},
	}, pulumi.Parent(parent))
	if err != nil {
		return nil, nil, fmt.Errorf("installer ClusterRole: %w", err)
	}
	binding, err := rbacv1.NewClusterRoleBinding(ctx, name+"-installer-binding", &rbacv1.ClusterRoleBindingArgs{
		Metadata: a.meta(false),
		RoleRef: rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"),
			Kind:     pulumi.String("ClusterRole"),
			Name:     role.Metadata.Name().Elem(),
		},
		Subjects: rbacv1.SubjectArray{rbacv1.SubjectArgs{
			Kind:      pulumi.String("ServiceAccount"),
			Name:      sa.Metadata.Name().Elem(),
			Namespace: pulumi.String(a.namespace()),
		}},
	}, pulumi.Parent(parent))
	if err != nil {
		return nil, nil, fmt.Errorf("installer ClusterRoleBinding: %w", err)
	}
	return sa, binding, nil
}

// podSpec is the installer's pod: privileged, in the host PID namespace, with the host's
// root mounted, on the sandbox nodes of its architectures.
func (a *NodeInstallerArgs) podSpec(serviceAccount pulumi.StringOutput, base string) corev1.PodSpecArgs {
	return corev1.PodSpecArgs{
		ServiceAccountName: serviceAccount,
		ImagePullSecrets:   a.pullSecrets(),
		// Host PID namespace: nsenter into PID 1 to restart containerd.
		HostPID:                       pulumi.Bool(true),
		PriorityClassName:             pulumi.String("system-node-critical"),
		TerminationGracePeriodSeconds: pulumi.Int(5),
		NodeSelector: pulumi.StringMap{
			components.SandboxPoolLabelKey: pulumi.String(components.SandboxPoolLabelValue),
		},
		Affinity: corev1.AffinityArgs{NodeAffinity: corev1.NodeAffinityArgs{
			RequiredDuringSchedulingIgnoredDuringExecution: corev1.NodeSelectorArgs{
				NodeSelectorTerms: corev1.NodeSelectorTermArray{corev1.NodeSelectorTermArgs{
					MatchExpressions: corev1.NodeSelectorRequirementArray{corev1.NodeSelectorRequirementArgs{
						Key: pulumi.String("kubernetes.io/arch"), Operator: pulumi.String("In"), Values: a.nodeArchs(),
					}},
				}},
			},
		}},
		Tolerations: corev1.TolerationArray{
			corev1.TolerationArgs{
				Key:      pulumi.String(components.SandboxTaintKey),
				Operator: pulumi.String("Equal"),
				Value:    pulumi.String(components.SandboxTaintValue),
				Effect:   pulumi.String(components.SandboxTaintEffect),
			},
			// The startup taint is there until this pod removes it.
			corev1.TolerationArgs{
				Key:      pulumi.String(karpenter.StartupTaintKey),
				Operator: pulumi.String("Exists"),
				Effect:   pulumi.String(karpenter.StartupTaintEffect),
			},
		},
		Containers: corev1.ContainerArray{a.container(base)},
		Volumes: corev1.VolumeArray{corev1.VolumeArgs{
			Name:     pulumi.String("host-root"),
			HostPath: corev1.HostPathVolumeSourceArgs{Path: pulumi.String("/"), Type: pulumi.String("Directory")},
		}},
	}
}

// container runs InstallerScript with bash, privileged, ready once the script has written
// readyFile.
func (a *NodeInstallerArgs) container(base string) corev1.ContainerArgs {
	privileged := true
	return corev1.ContainerArgs{
		Name:    pulumi.String("install"),
		Image:   pulumi.String(a.Image),
		Command: pulumi.StringArray{pulumi.String("/bin/bash"), pulumi.String("-c"), pulumi.String(InstallerScript)},
		Env:     a.env(base),
		SecurityContext: corev1.SecurityContextArgs{
			Privileged: pulumi.BoolPtr(privileged),
		},
		VolumeMounts: corev1.VolumeMountArray{corev1.VolumeMountArgs{
			Name: pulumi.String("host-root"), MountPath: pulumi.String(hostRoot),
		}},
		ReadinessProbe: corev1.ProbeArgs{
			Exec: corev1.ExecActionArgs{Command: pulumi.StringArray{
				pulumi.String("cat"), pulumi.String(readyFile),
			}},
			PeriodSeconds: pulumi.Int(5),
		},
		Resources: corev1.ResourceRequirementsArgs{
			Requests: pulumi.StringMap{"cpu": pulumi.String("10m"), "memory": pulumi.String("32Mi")},
			Limits:   pulumi.StringMap{"memory": pulumi.String("256Mi")},
		},
	}
}

// env is the script's environment (see node-installer.sh): its mode, where it downloads
// from, its paths and names, the node it runs on, and the expected digests per architecture.
func (a *NodeInstallerArgs) env(base string) corev1.EnvVarArray {
	mode := "install"
	if a.VerifyOnly {
		mode = "verify"
	}
	env := corev1.EnvVarArray{
		corev1.EnvVarArgs{Name: pulumi.String("MODE"), Value: pulumi.String(mode)},
		corev1.EnvVarArgs{Name: pulumi.String("BINARY_BASE_URL"), Value: pulumi.String(base)},
		corev1.EnvVarArgs{Name: pulumi.String("HOST_ROOT"), Value: pulumi.String(hostRoot)},
		corev1.EnvVarArgs{Name: pulumi.String("READY_FILE"), Value: pulumi.String(readyFile)},
		corev1.EnvVarArgs{Name: pulumi.String("READY_LABEL"), Value: pulumi.String(ReadyLabelKey)},
		corev1.EnvVarArgs{Name: pulumi.String("STARTUP_TAINT"), Value: pulumi.String(karpenter.StartupTaintKey)},
		corev1.EnvVarArgs{Name: pulumi.String("NODE_NAME"), ValueFrom: corev1.EnvVarSourceArgs{
			FieldRef: corev1.ObjectFieldSelectorArgs{FieldPath: pulumi.String("spec.nodeName")},
		}},
	}
	for _, arch := range slices.Sorted(maps.Keys(a.SHA256)) {
		up := strings.ToUpper(arch)
		env = append(env,
			corev1.EnvVarArgs{Name: pulumi.String("SHA256_RUNSC_" + up), Value: pulumi.String(a.SHA256[arch].Runsc)},
			corev1.EnvVarArgs{Name: pulumi.String("SHA256_SHIM_" + up), Value: pulumi.String(a.SHA256[arch].Shim)},
		)
	}
	return env
}

// nodeArchs are the kubernetes.io/arch values of the nodes the installer runs on: those with
// digests, or every one a verify-only installer checks.
func (a *NodeInstallerArgs) nodeArchs() pulumi.StringArray {
	if a.VerifyOnly {
		return pulumi.StringArray{pulumi.String("amd64"), pulumi.String("arm64")}
	}
	var out pulumi.StringArray
	for _, arch := range slices.Sorted(maps.Keys(a.SHA256)) {
		out = append(out, pulumi.String(archs[arch]))
	}
	return out
}

func (a *NodeInstallerArgs) pullSecrets() corev1.LocalObjectReferenceArray {
	var pull corev1.LocalObjectReferenceArray
	for _, n := range a.ImagePullSecrets {
		pull = append(pull, corev1.LocalObjectReferenceArgs{Name: pulumi.String(n)})
	}
	return pull
}
