package manager

import (
	"fmt"

	"github.com/fusebox-dev/fusebox/components"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// SandboxTemplateKey is the ConfigMap key holding the sandbox pod template.
const SandboxTemplateKey = "pod.yaml"

// SandboxTemplate describes the pods the manager creates for sandboxes.
type SandboxTemplate struct {
	// Image is the sandbox server image, by digest. Required.
	Image string
	// RuntimeClassName defaults to "gvisor".
	RuntimeClassName string
	// CPU is each sandbox's CPU request (default "1"): a weight (cgroup cpu.shares) that
	// divides a busy node fairly and costs nothing while a CPU is idle. Memory is its request
	// and limit (default "2Gi").
	CPU, Memory string
	// CPULimit, when set, is a CFS quota (limits.cpu) of at least CPU. Empty (the default):
	// none, because a quota stalls a sandbox once a burst of gVisor's host threads has used
	// it (see docs/performance.md; the same default as fusebox local up's).
	CPULimit string
	// EphemeralStorage caps the workspace (default "10Gi").
	EphemeralStorage string
	// Placement puts sandbox pods on their nodes; nil is the fusebox sandbox pool (its label
	// and taint, which Karpenter's NodePool sets).
	Placement *Placement
	// ImagePullSecrets name Secrets in the sandbox namespace for the sandbox image.
	ImagePullSecrets []string
}

// Placement is a node selector and the tolerations that go with it.
type Placement struct {
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
}

// SandboxPoolPlacement is the fusebox sandbox node pool: its label, and a toleration of its
// taint.
func SandboxPoolPlacement() Placement {
	return Placement{
		NodeSelector: map[string]string{components.SandboxPoolLabelKey: components.SandboxPoolLabelValue},
		Tolerations: []corev1.Toleration{{
			Key: components.SandboxTaintKey, Operator: corev1.TolerationOpEqual, Value: components.SandboxTaintValue,
			Effect: corev1.TaintEffect(components.SandboxTaintEffect),
		}},
	}
}

// GKESandboxPlacement is a GKE Sandbox node pool (sandboxConfig type gvisor): GKE labels its
// nodes sandbox.gke.io/runtime=gvisor and taints them sandbox.gke.io/runtime=gvisor:NoSchedule,
// and its own RuntimeClass "gvisor" adds the same selector and toleration to every pod that
// names it; the template states them so that it says where its pods go.
func GKESandboxPlacement() Placement {
	return Placement{
		NodeSelector: map[string]string{GKESandboxLabel: "gvisor"},
		Tolerations: []corev1.Toleration{{
			Key: GKESandboxLabel, Operator: corev1.TolerationOpEqual, Value: "gvisor", Effect: corev1.TaintEffectNoSchedule,
		}},
	}
}

// sandboxCommandUser is the user and group the sandbox server runs its commands as
// (kubealloc.CommandUser, which the manager enforces).
const sandboxCommandUser = "65532:65532"

// GKESandboxLabel is the label and taint key of GKE Sandbox nodes.
const GKESandboxLabel = "sandbox.gke.io/runtime"

// Pod returns the sandbox pod template. It satisfies the sandbox admission policy: gVisor, no
// service-account token, nothing privileged, no host access, no capabilities added but the
// server's SETUID and SETGID (its commands run as sandboxCommandUser); it runs
// on the sandbox node pool (its label and taint). The manager (--sandbox-template) takes the
// image, resources, placement, labels and ports from it and enforces the security settings
// itself, refusing a template that contradicts them (kubealloc.TemplateFromPod).
func (t SandboxTemplate) Pod() (*corev1.Pod, error) {
	if err := components.ValidateImage(t.Image); err != nil {
		return nil, fmt.Errorf("sandbox image: %w", err)
	}
	rc := or(t.RuntimeClassName, components.RuntimeClassName)
	req, err := quantities(map[corev1.ResourceName]string{
		corev1.ResourceCPU:              or(t.CPU, "1"),
		corev1.ResourceMemory:           or(t.Memory, "2Gi"),
		corev1.ResourceEphemeralStorage: or(t.EphemeralStorage, "10Gi"),
	})
	if err != nil {
		return nil, err
	}
	lim := corev1.ResourceList{corev1.ResourceMemory: req[corev1.ResourceMemory], corev1.ResourceEphemeralStorage: req[corev1.ResourceEphemeralStorage]}
	if t.CPULimit != "" {
		q, err := resource.ParseQuantity(t.CPULimit)
		if err != nil {
			return nil, fmt.Errorf("sandbox cpu limit %q: %w", t.CPULimit, err)
		}
		if q.Cmp(req[corev1.ResourceCPU]) < 0 {
			return nil, fmt.Errorf("sandbox cpu limit %s is below its request %s", t.CPULimit, or(t.CPU, "1"))
		}
		lim[corev1.ResourceCPU] = q
	}
	no, yes := false, true
	root := int64(0)
	place := SandboxPoolPlacement()
	if t.Placement != nil {
		place = *t.Placement
	}
	var pull []corev1.LocalObjectReference
	for _, n := range t.ImagePullSecrets {
		pull = append(pull, corev1.LocalObjectReference{Name: n})
	}
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			"app.kubernetes.io/name":    components.SandboxAppLabel,
			"app.kubernetes.io/part-of": "fusebox",
		}},
		Spec: corev1.PodSpec{
			RuntimeClassName:             &rc,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			RestartPolicy:                corev1.RestartPolicyNever,
			NodeSelector:                 place.NodeSelector,
			Tolerations:                  place.Tolerations,
			ImagePullSecrets:             pull,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "sandbox",
				Image: t.Image,
				Args: []string{
					fmt.Sprintf("-init-listen=tcp://0.0.0.0:%d", components.InitPort),
					fmt.Sprintf("-data-listen=tcp://0.0.0.0:%d", components.DataPort),
					"-command-user=" + sandboxCommandUser,
				},
				Ports: []corev1.ContainerPort{
					{Name: "init", ContainerPort: components.InitPort, Protocol: corev1.ProtocolTCP},
					{Name: "data", ContainerPort: components.DataPort, Protocol: corev1.ProtocolTCP},
				},
				Resources: corev1.ResourceRequirements{Requests: req, Limits: lim},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(components.InitPort)},
				}, PeriodSeconds: 1},
				// The server starts as root inside gVisor, keeps only what it needs to run
				// its commands as another user (package privsep), and the commands run
				// as that user with no capabilities; the manager enforces the same.
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no, Privileged: &no, RunAsUser: &root, RunAsGroup: &root, ReadOnlyRootFilesystem: &yes,
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SETUID", "SETGID"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
		},
	}, nil
}

// YAML returns the template as the manager reads it from the ConfigMap.
func (t SandboxTemplate) YAML() (string, error) {
	p, err := t.Pod()
	if err != nil {
		return "", err
	}
	b, err := yaml.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encoding sandbox template: %w", err)
	}
	return string(b), nil
}

// quantities parses each resource's quantity, naming the one that does not parse.
func quantities(m map[corev1.ResourceName]string) (corev1.ResourceList, error) {
	l := corev1.ResourceList{}
	for k, v := range m {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s %q: %w", k, v, err)
		}
		l[k] = q
	}
	return l, nil
}

func or(v, d string) string {
	if v == "" {
		return d
	}
	return v
}
