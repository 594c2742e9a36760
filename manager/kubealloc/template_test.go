package kubealloc

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// templateYAML is a sandbox pod template as an operator might write it.
const templateYAML = `apiVersion: v1
kind: Pod
metadata:
  labels:
    app.kubernetes.io/name: fusebox-sandbox
    team: ml
  annotations:
    example.com/owner: ml-platform
spec:
  runtimeClassName: gvisor
  automountServiceAccountToken: false
  restartPolicy: Never
  nodeSelector:
    pool.example.com/name: sandboxes
  tolerations:
  - key: pool.example.com/sandbox
    operator: Exists
    effect: NoSchedule
  securityContext:
    runAsNonRoot: false
    seccompProfile:
      type: RuntimeDefault
  containers:
  - name: sandbox
    image: registry.example.com/fusebox/sandbox@sha256:0123
    args: ["-init-listen=tcp://0.0.0.0:7070", "-data-listen=tcp://0.0.0.0:7071", "-max-file-bytes=4096"]
    ports:
    - {name: init, containerPort: 7070}
    - {name: data, containerPort: 7071, protocol: TCP}
    resources:
      requests: {cpu: 500m, memory: 1Gi}
      limits: {cpu: "2", memory: 3Gi}
    securityContext:
      privileged: false
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL], add: [SETUID, SETGID]}
`

func TestParseTemplateBuildsThePod(t *testing.T) {
	tpl, err := ParseTemplate([]byte(templateYAML))
	if err != nil {
		t.Fatal(err)
	}
	p := BuildPod(PodSpec{ID: "sb-1", Namespace: "ns", TemplateName: "default", Template: tpl, RuntimeClassName: "gvisor", Pool: DefaultNodePool()})
	s, c := p.Spec, p.Spec.Containers[0]
	if c.Image != "registry.example.com/fusebox/sandbox@sha256:0123" {
		t.Errorf("image %s", c.Image)
	}
	if s.NodeSelector["pool.example.com/name"] != "sandboxes" || len(s.NodeSelector) != 1 ||
		len(s.Tolerations) != 1 || s.Tolerations[0].Key != "pool.example.com/sandbox" {
		t.Errorf("placement %v %v, want the template's", s.NodeSelector, s.Tolerations)
	}
	if !c.Resources.Requests.Cpu().Equal(resource.MustParse("500m")) || !c.Resources.Limits.Memory().Equal(resource.MustParse("3Gi")) {
		t.Errorf("resources %v", c.Resources)
	}
	if p.Labels["team"] != "ml" || p.Annotations[AnnotationState] != StateReady || p.Labels[LabelSandboxID] != "sb-1" || p.Annotations["example.com/owner"] != "ml-platform" {
		t.Errorf("metadata %v %v", p.Labels, p.Annotations)
	}
	if got := strings.Join(c.Args, " "); got != "-init-listen=tcp://0.0.0.0:7070 -data-listen=tcp://0.0.0.0:7071 -workspace=/workspace -command-user=65532:65532 -idle-ttl=24h -max-file-bytes=4096" {
		t.Errorf("args %s", got)
	}
	checkEnforced(t, p)
}

// checkEnforced fails unless p carries every security setting BuildPod enforces.
func checkEnforced(t *testing.T, p *corev1.Pod) {
	t.Helper()
	s := p.Spec
	c := s.Containers[0]
	sc := c.SecurityContext
	for name, ok := range map[string]bool{
		"runtimeClassName gvisor":            s.RuntimeClassName != nil && *s.RuntimeClassName == "gvisor",
		"automountServiceAccountToken false": s.AutomountServiceAccountToken != nil && !*s.AutomountServiceAccountToken,
		"no host namespaces":                 !s.HostNetwork && !s.HostPID && !s.HostIPC,
		"pod server as root inside gVisor":   *s.SecurityContext.RunAsUser == 0 && *s.SecurityContext.FSGroup == SandboxUID,
		"pod seccomp RuntimeDefault":         s.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
		"one container, workspace only":      len(s.Containers) == 1 && len(s.InitContainers) == 0 && len(s.Volumes) == 1 && s.Volumes[0].EmptyDir != nil,
		"server as root, commands apart":     *sc.RunAsUser == 0 && slices.Contains(c.Args, "-command-user=65532:65532"),
		"not privileged":                     sc.Privileged != nil && !*sc.Privileged,
		"no privilege escalation":            sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		"drop ALL, add SETUID and SETGID": len(sc.Capabilities.Drop) == 1 && sc.Capabilities.Drop[0] == "ALL" &&
			slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SETUID", "SETGID"}),
		"container seccomp RuntimeDefault": sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
		"read-only root filesystem":        *sc.ReadOnlyRootFilesystem,
		"ports init 7070 and data 7071": len(c.Ports) == 2 && c.Ports[0].Name == "init" && c.Ports[0].ContainerPort == InitPort &&
			c.Ports[1].Name == "data" && c.Ports[1].ContainerPort == DataPort && c.Ports[0].HostPort == 0 && c.Ports[1].HostPort == 0,
		"resource requests and limits": !c.Resources.Requests.Cpu().IsZero() && !c.Resources.Limits.Memory().IsZero(),
		"app label":                    p.Labels[LabelApp] == AppName,
	} {
		if !ok {
			t.Errorf("built pod: %s: not met", name)
		}
	}
}

func TestTemplateRefusesContradictions(t *testing.T) {
	for _, c := range []struct{ name, from, to, field string }{
		{"privileged", "privileged: false", "privileged: true", "spec.containers[0].securityContext.privileged"},
		{"runc", "runtimeClassName: gvisor", "runtimeClassName: runc", "spec.runtimeClassName"},
		{"privilege escalation", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "allowPrivilegeEscalation"},
		{"service account token", "automountServiceAccountToken: false", "automountServiceAccountToken: true", "spec.automountServiceAccountToken"},
		{"server user", "runAsNonRoot: false", "runAsNonRoot: false\n    runAsUser: 65532", "spec.securityContext.runAsUser"},
		{"pod non-root", "runAsNonRoot: false", "runAsNonRoot: true", "spec.securityContext.runAsNonRoot"},
		{"added capability", "add: [SETUID, SETGID]", "add: [SETUID, SETGID, NET_ADMIN]", "capabilities.add"},
		{"capabilities kept", "capabilities: {drop: [ALL], add: [SETUID, SETGID]}", "capabilities: {drop: [NET_RAW]}", "capabilities.drop"},
		{"commands as the server", "-max-file-bytes=4096", "-command-user=", "spec.containers[0].args"},
		{"writable root", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem"},
		{"unconfined seccomp", "type: RuntimeDefault", "type: Unconfined", "spec.securityContext.seccompProfile.type"},
		{"host network", "restartPolicy: Never", "restartPolicy: Never\n  hostNetwork: true", "spec.hostNetwork"},
		{"host path", "restartPolicy: Never", "restartPolicy: Never\n  volumes: [{name: h, hostPath: {path: /}}]", "spec.volumes"},
		{"restart", "restartPolicy: Never", "restartPolicy: Always", "spec.restartPolicy"},
		{"other port", "{name: data, containerPort: 7071, protocol: TCP}", "{name: data, containerPort: 8080}", "spec.containers[0].ports[1]"},
		{"extra port", "{name: data, containerPort: 7071, protocol: TCP}", "{name: data, containerPort: 7071}\n    - {name: ssh, containerPort: 22}", "spec.containers[0].ports[2]"},
		{"host port", "{name: init, containerPort: 7070}", "{name: init, containerPort: 7070, hostPort: 7070}", "spec.containers[0].ports[0]"},
		{"listen elsewhere", "-init-listen=tcp://0.0.0.0:7070", "-init-listen=tcp://0.0.0.0:9999", "spec.containers[0].args"},
		{"allocator's label", "team: ml", "team: ml\n    fusebox.dev/state: bound", "metadata.labels"},
		{"other app", "app.kubernetes.io/name: fusebox-sandbox", "app.kubernetes.io/name: something-else", "metadata.labels"},
		{"allocator's annotation", "example.com/owner: ml-platform", "kube.fusebox.dev/claimed-by: me", "metadata.annotations"},
		{"unknown field", "restartPolicy: Never", "restartPolicy: Never\n  privilegedd: true", "decoding"},
		{"no image", "image: registry.example.com/fusebox/sandbox@sha256:0123", "image: \"\"", "spec.containers[0].image"},
	} {
		t.Run(c.name, func(t *testing.T) {
			y := strings.Replace(templateYAML, c.from, c.to, 1)
			if y == templateYAML {
				t.Fatalf("fixture does not contain %q", c.from)
			}
			_, err := ParseTemplate([]byte(y))
			if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("ParseTemplate = %v, want a refusal naming %s", err, c.field)
			}
		})
	}
}
