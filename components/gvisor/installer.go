package gvisor

import (
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/karpenter"
	admissionregistrationv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/admissionregistration/v1"
	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// InstallerScript is the node installer the DaemonSet runs with bash (see node-installer.sh).
// On AKS (MODE=install): install runsc and its shim from the installer image's /opt/gvisor,
// each checked against the SHA-256 that `fusebox image build` recorded in the image
// (/opt/gvisor/SHA256SUMS), register the runtime with containerd (config version 2: appended
// to config.toml, as containerd 1.7 lets an import replace the whole CRI section; version 3: a
// drop-in where the config imports a conf.d directory; systemd-cgroup where the kubelet uses
// the systemd cgroup driver), restart containerd through nsenter. On EKS (MODE=verify), where the userData installed it: check that runsc and its
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

// NodeInstallerArgs configure the node-installer DaemonSet used on AKS.
type NodeInstallerArgs struct {
	// Image is the gvisor-installer image of `fusebox image build`, by digest. Required. It
	// runs the script (bash, curl, coreutils, nsenter) and carries the runsc and
	// containerd-shim-runsc-v1 that an installing installer puts on the node, with their
	// SHA-256 recorded at build: the image's digest pins the binaries, so no checksum is
	// configured and nothing is downloaded.
	Image string `pulumi:"image"`
	// Namespace is where the DaemonSet runs (default kube-system).
	Namespace string `pulumi:"namespace"`
	// VerifyOnly (EKS, whose userData installs gVisor before the kubelet starts) installs
	// nothing: the installer checks that runsc and its shim are on the node and registered in
	// containerd's running configuration, then removes the startup taint.
	VerifyOnly bool `pulumi:"verifyOnly"`
	// ImagePullSecrets name Secrets in Namespace for pulling Image from a private registry.
	ImagePullSecrets []string `pulumi:"imagePullSecrets"`
}

// ErrBadInstaller is wrapped by NewGVisor's errors for unusable NodeInstallerArgs.
var ErrBadInstaller = errors.New("bad gVisor node installer settings")

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

// validate checks a.
func (a *NodeInstallerArgs) validate() error {
	if err := components.ValidateImage(a.Image); err != nil {
		return fmt.Errorf("%w: image: %w", ErrBadInstaller, err)
	}
	return nil
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
func newNodeInstaller(ctx *pulumi.Context, name string, a *NodeInstallerArgs, parent pulumi.Resource) (*appsv1.DaemonSet, error) {
	sa, binding, err := installerRBAC(ctx, name, a, parent)
	if err != nil {
		return nil, err
	}
	ownNode, err := ownNodePolicy(ctx, name, a, parent)
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
				Spec:     a.podSpec(sa.Metadata.Name().Elem()),
			},
		},
	}, pulumi.Parent(parent), pulumi.DependsOn([]pulumi.Resource{binding, ownNode}), pulumi.Timeouts(&InstallerTimeouts))
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
//
// RBAC cannot say "the node this pod runs on": resourceNames are fixed in the role, and one
// ClusterRole serves every pod of the DaemonSet, so the role grants get and patch on all
// nodes, and ownNodePolicy narrows the patch to what the installer does on its own node.
// Reads (get) pass no admission, so they stay cluster-wide: a node's spec and labels, which
// every service account with node read access (many system components) sees too. No list,
// watch, update, delete, and not nodes/status.
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

// nodeNameExtra is the user-info extra in which the API server puts the name of the node that
// a pod-bound service-account token's pod runs on (Kubernetes 1.30 and later,
// ServiceAccountTokenPodNodeInfo; k8s.io/apiserver/pkg/authentication/serviceaccount
// NodeNameKey).
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// ownNodeValidations are the CEL rules with which the API server admits a change of a node by
// the installer (what NodeRestriction does for kubelets): the node is the one its pod runs on
// (the name the API server put in its token's user info), no taint is added or changed and
// only the startup taint is removed, no label is changed or removed but the ready label set
// to ReadyLabelValue, and nothing else of the node's spec or metadata changes.
func ownNodeValidations() []struct{ name, expr, msg string } {
	same := func(obj, field string) string {
		return fmt.Sprintf("(has(object.%[1]s.%[2]s) == has(oldObject.%[1]s.%[2]s) && (!has(object.%[1]s.%[2]s) || object.%[1]s.%[2]s == oldObject.%[1]s.%[2]s))", obj, field)
	}
	var unchanged []string
	for _, f := range []string{"podCIDR", "podCIDRs", "providerID", "unschedulable", "configSource", "externalID"} {
		unchanged = append(unchanged, same("spec", f))
	}
	for _, f := range []string{"annotations", "finalizers", "ownerReferences"} {
		unchanged = append(unchanged, same("metadata", f))
	}
	return []struct{ name, expr, msg string }{
		{
			"own-node",
			fmt.Sprintf("has(request.userInfo.extra) && '%[1]s' in request.userInfo.extra && request.userInfo.extra['%[1]s'] == [object.metadata.name]", nodeNameExtra),
			"the gVisor node installer may change only the node its pod runs on",
		},
		{
			"only-startup-taint-removed",
			"(!has(object.spec.taints) || object.spec.taints.all(t, has(oldObject.spec.taints) && t in oldObject.spec.taints)) && " +
				"(!has(oldObject.spec.taints) || oldObject.spec.taints.all(t, (has(object.spec.taints) && t in object.spec.taints) || " +
				fmt.Sprintf("(t.key == '%s' && t.effect == '%s')))", karpenter.StartupTaintKey, karpenter.StartupTaintEffect),
			fmt.Sprintf("the gVisor node installer may only remove the taint %s:%s", karpenter.StartupTaintKey, karpenter.StartupTaintEffect),
		},
		{
			"only-ready-label",
			fmt.Sprintf("(!has(object.metadata.labels) || object.metadata.labels.all(k, k == '%[1]s' ? object.metadata.labels[k] == '%[2]s' : "+
				"(has(oldObject.metadata.labels) && k in oldObject.metadata.labels && oldObject.metadata.labels[k] == object.metadata.labels[k]))) && "+
				"(!has(oldObject.metadata.labels) || oldObject.metadata.labels.all(k, has(object.metadata.labels) && k in object.metadata.labels))", ReadyLabelKey, ReadyLabelValue),
			fmt.Sprintf("the gVisor node installer may only set the label %s=%s", ReadyLabelKey, ReadyLabelValue),
		},
		{
			"nothing-else",
			strings.Join(unchanged, " && "),
			"the gVisor node installer may change only the node's startup taint and ready label",
		},
	}
}

// ownNodePolicy registers the ValidatingAdmissionPolicy (and its binding) that holds the
// installer's node patches to ownNodeValidations: RBAC grants patch on every node, this policy
// admits only the installer's own work on its own node. It applies to the installer's service
// account alone (a match condition on the request's user name) and fails closed: a change the
// API server cannot evaluate is refused, which leaves the startup taint in place.
func ownNodePolicy(ctx *pulumi.Context, name string, a *NodeInstallerArgs, parent pulumi.Resource) (pulumi.Resource, error) {
	policyName := InstallerName + "-own-node"
	var vs admissionregistrationv1.ValidationArray
	for _, v := range ownNodeValidations() {
		vs = append(vs, admissionregistrationv1.ValidationArgs{
			Expression: pulumi.String(v.expr), Message: pulumi.String(v.msg), Reason: pulumi.String("Forbidden"),
		})
	}
	match := admissionregistrationv1.MatchResourcesArgs{
		ResourceRules: admissionregistrationv1.NamedRuleWithOperationsArray{admissionregistrationv1.NamedRuleWithOperationsArgs{
			ApiGroups:   pulumi.StringArray{pulumi.String("")},
			ApiVersions: pulumi.StringArray{pulumi.String("v1")},
			Operations:  pulumi.StringArray{pulumi.String("UPDATE")},
			Resources:   pulumi.StringArray{pulumi.String("nodes")},
		}},
	}
	meta := metav1.ObjectMetaArgs{Name: pulumi.String(policyName), Labels: installerLabels()}
	policy, err := admissionregistrationv1.NewValidatingAdmissionPolicy(ctx, name+"-installer-policy", &admissionregistrationv1.ValidatingAdmissionPolicyArgs{
		Metadata: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpecArgs{
			FailurePolicy:    pulumi.String("Fail"),
			MatchConstraints: match,
			MatchConditions: admissionregistrationv1.MatchConditionArray{admissionregistrationv1.MatchConditionArgs{
				Name:       pulumi.String("installer"),
				Expression: pulumi.String(fmt.Sprintf("request.userInfo.username == 'system:serviceaccount:%s:%s'", a.namespace(), InstallerName)),
			}},
			Validations: vs,
		},
	}, pulumi.Parent(parent))
	if err != nil {
		return nil, fmt.Errorf("installer ValidatingAdmissionPolicy: %w", err)
	}
	binding, err := admissionregistrationv1.NewValidatingAdmissionPolicyBinding(ctx, name+"-installer-policy-binding", &admissionregistrationv1.ValidatingAdmissionPolicyBindingArgs{
		Metadata: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpecArgs{
			PolicyName:        pulumi.String(policyName),
			ValidationActions: pulumi.StringArray{pulumi.String("Deny")},
			MatchResources:    match,
		},
	}, pulumi.Parent(parent), pulumi.DependsOn([]pulumi.Resource{policy}))
	if err != nil {
		return nil, fmt.Errorf("installer ValidatingAdmissionPolicyBinding: %w", err)
	}
	return binding, nil
}

// podSpec is the installer's pod: privileged, in the host PID namespace, with the host's
// root mounted, on the sandbox nodes of its architectures.
func (a *NodeInstallerArgs) podSpec(serviceAccount pulumi.StringOutput) corev1.PodSpecArgs {
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
		Containers: corev1.ContainerArray{a.container()},
		Volumes: corev1.VolumeArray{corev1.VolumeArgs{
			Name:     pulumi.String("host-root"),
			HostPath: corev1.HostPathVolumeSourceArgs{Path: pulumi.String("/"), Type: pulumi.String("Directory")},
		}},
	}
}

// container runs InstallerScript with bash, privileged, ready once the script has written
// readyFile.
func (a *NodeInstallerArgs) container() corev1.ContainerArgs {
	privileged := true
	return corev1.ContainerArgs{
		Name:    pulumi.String("install"),
		Image:   pulumi.String(a.Image),
		Command: pulumi.StringArray{pulumi.String("/bin/bash"), pulumi.String("-c"), pulumi.String(InstallerScript)},
		Env:     a.env(),
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

// env is the script's environment (see node-installer.sh): its mode, its paths and names,
// and the node it runs on.
func (a *NodeInstallerArgs) env() corev1.EnvVarArray {
	mode := "install"
	if a.VerifyOnly {
		mode = "verify"
	}
	return corev1.EnvVarArray{
		corev1.EnvVarArgs{Name: pulumi.String("MODE"), Value: pulumi.String(mode)},
		corev1.EnvVarArgs{Name: pulumi.String("HOST_ROOT"), Value: pulumi.String(hostRoot)},
		corev1.EnvVarArgs{Name: pulumi.String("READY_FILE"), Value: pulumi.String(readyFile)},
		corev1.EnvVarArgs{Name: pulumi.String("READY_LABEL"), Value: pulumi.String(ReadyLabelKey)},
		corev1.EnvVarArgs{Name: pulumi.String("STARTUP_TAINT"), Value: pulumi.String(karpenter.StartupTaintKey)},
		corev1.EnvVarArgs{Name: pulumi.String("NODE_NAME"), ValueFrom: corev1.EnvVarSourceArgs{
			FieldRef: corev1.ObjectFieldSelectorArgs{FieldPath: pulumi.String("spec.nodeName")},
		}},
	}
}

// nodeArchs are the kubernetes.io/arch values of the nodes the installer runs on: the
// architectures gVisor supports. An installer image of another architecture than a node's
// (`fusebox image build` builds for its machine's) does not start there, so that node keeps
// its startup taint and gets no sandbox: the node pool's kubernetes.io/arch requirement
// should name the image's architecture.
func (a *NodeInstallerArgs) nodeArchs() pulumi.StringArray {
	return pulumi.StringArray{pulumi.String("amd64"), pulumi.String("arm64")}
}

func (a *NodeInstallerArgs) pullSecrets() corev1.LocalObjectReferenceArray {
	var pull corev1.LocalObjectReferenceArray
	for _, n := range a.ImagePullSecrets {
		pull = append(pull, corev1.LocalObjectReferenceArgs{Name: pulumi.String(n)})
	}
	return pull
}
