package manager

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestManagerBuildsPodsFromTheRenderedTemplate reads the template exactly as the manager
// does (--sandbox-template: kubealloc.ParseTemplate of the ConfigMap's YAML) and checks that
// the pods it builds carry the template's image, resources and placement with the security
// settings the allocator enforces.
func TestManagerBuildsPodsFromTheRenderedTemplate(t *testing.T) {
	y, err := SandboxTemplate{Image: sbxImage, CPU: "1500m", Memory: "3Gi", EphemeralStorage: "5Gi"}.YAML()
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := kubealloc.ParseTemplate([]byte(y))
	if err != nil {
		t.Fatalf("the manager refuses the component's template: %v", err)
	}
	p := kubealloc.BuildPod(kubealloc.PodSpec{ID: "sb-1", Namespace: "sbx", TemplateName: "default", Template: tpl,
		RuntimeClassName: "gvisor", Pool: kubealloc.NodePool{NodeSelector: map[string]string{"elsewhere": "x"}}})
	s, c := p.Spec, p.Spec.Containers[0]
	if c.Image != sbxImage {
		t.Errorf("image %s", c.Image)
	}
	if len(s.NodeSelector) != 1 || s.NodeSelector[components.SandboxPoolLabelKey] != components.SandboxPoolLabelValue {
		t.Errorf("nodeSelector %v, want the sandbox pool's", s.NodeSelector)
	}
	if len(s.Tolerations) != 1 || s.Tolerations[0].Key != components.SandboxTaintKey || s.Tolerations[0].Value != components.SandboxTaintValue ||
		string(s.Tolerations[0].Effect) != components.SandboxTaintEffect {
		t.Errorf("tolerations %v, want the sandbox taint's", s.Tolerations)
	}
	for _, rl := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		if !rl.Memory().Equal(resource.MustParse("3Gi")) || !rl.StorageEphemeral().Equal(resource.MustParse("5Gi")) {
			t.Errorf("resources %v", c.Resources)
		}
	}
	if !c.Resources.Requests.Cpu().Equal(resource.MustParse("1500m")) {
		t.Errorf("cpu request %v, want 1500m", c.Resources.Requests.Cpu())
	}
	if _, quota := c.Resources.Limits[corev1.ResourceCPU]; quota {
		t.Errorf("cpu limit %v: a CFS quota the template did not ask for", c.Resources.Limits.Cpu())
	}
	if p.Labels["app.kubernetes.io/part-of"] != "fusebox" || p.Labels["app.kubernetes.io/name"] != components.SandboxAppLabel {
		t.Errorf("labels %v", p.Labels)
	}
	sc := c.SecurityContext
	for name, ok := range map[string]bool{
		"runtimeClassName gvisor":            s.RuntimeClassName != nil && *s.RuntimeClassName == components.RuntimeClassName,
		"automountServiceAccountToken false": s.AutomountServiceAccountToken != nil && !*s.AutomountServiceAccountToken,
		"pod server as root inside gVisor":   s.SecurityContext.RunAsUser != nil && *s.SecurityContext.RunAsUser == 0,
		"pod seccomp RuntimeDefault":         s.SecurityContext.SeccompProfile != nil && s.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
		"commands apart from the server":     sc.RunAsUser != nil && *sc.RunAsUser == 0 && slices.Contains(c.Args, "-command-user="+kubealloc.CommandUser),
		"no privilege escalation":            sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		"not privileged":                     sc.Privileged != nil && !*sc.Privileged,
		"drop ALL but SETUID and SETGID": sc.Capabilities != nil && slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) &&
			slices.Equal(sc.Capabilities.Add, kubealloc.ServerCapabilities),
		"container seccomp RuntimeDefault": sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
		"ports init and data": len(c.Ports) == 2 && c.Ports[0].ContainerPort == components.InitPort &&
			c.Ports[1].ContainerPort == components.DataPort,
	} {
		if !ok {
			t.Errorf("pod built from the template: %s: not met", name)
		}
	}
}

// TestManagerRefusesContradictingTemplate: a template whose runtime class is not gVisor (the
// component lets its args name one) is refused by the manager, naming the field.
func TestManagerRefusesContradictingTemplate(t *testing.T) {
	y, err := SandboxTemplate{Image: sbxImage, RuntimeClassName: "runc"}.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubealloc.ParseTemplate([]byte(y)); !errors.Is(err, kubealloc.ErrTemplate) || !strings.Contains(err.Error(), "spec.runtimeClassName") {
		t.Fatalf("ParseTemplate = %v, want a refusal naming spec.runtimeClassName", err)
	}
	privileged := strings.Replace(mustYAML(t), "privileged: false", "privileged: true", 1)
	if _, err := kubealloc.ParseTemplate([]byte(privileged)); !errors.Is(err, kubealloc.ErrTemplate) || !strings.Contains(err.Error(), "securityContext.privileged") {
		t.Fatalf("ParseTemplate = %v, want a refusal naming securityContext.privileged", err)
	}
}

func mustYAML(t *testing.T) string {
	t.Helper()
	y, err := SandboxTemplate{Image: sbxImage}.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(y, "privileged: false") {
		t.Fatalf("template lacks privileged: false:\n%s", y)
	}
	return y
}

// TestDeploymentReadsTheTemplate: the manager's args point at the mounted ConfigMap key.
func TestDeploymentReadsTheTemplate(t *testing.T) {
	m, _ := run(t, args())
	pod := mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec")
	c := mocktest.Dig(pod, "containers", 0)
	if !slices.Contains(strs(mocktest.Dig(c, "args")), "--sandbox-template=/etc/fusebox/sandbox/"+SandboxTemplateKey) {
		t.Errorf("args %v lack --sandbox-template", mocktest.Dig(c, "args"))
	}
	mounted := false
	for _, vm := range mocktest.Dig(c, "volumeMounts").([]any) {
		if mocktest.Str(vm, "name") == "sandbox-template" && mocktest.Str(vm, "mountPath") == "/etc/fusebox/sandbox" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("template ConfigMap not mounted at /etc/fusebox/sandbox: %v", mocktest.Dig(c, "volumeMounts"))
	}
}

// TestSandboxCPULimitIsOptIn: a CPU limit (a CFS quota) is set only when the template asks
// for one, and one below the request is refused naming both.
func TestSandboxCPULimitIsOptIn(t *testing.T) {
	p, err := SandboxTemplate{Image: sbxImage, CPU: "500m", CPULimit: "2"}.Pod()
	if err != nil {
		t.Fatal(err)
	}
	r := p.Spec.Containers[0].Resources
	if !r.Limits.Cpu().Equal(resource.MustParse("2")) || !r.Requests.Cpu().Equal(resource.MustParse("500m")) {
		t.Errorf("resources %v, want a 500m request and a 2 CPU limit", r)
	}
	for _, tc := range []struct{ limit, want string }{
		{"250m", "sandbox cpu limit 250m is below its request 500m"},
		{"lots", `sandbox cpu limit "lots"`},
	} {
		if _, err := (SandboxTemplate{Image: sbxImage, CPU: "500m", CPULimit: tc.limit}).Pod(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CPULimit %s: Pod() = %v, want an error containing %q", tc.limit, err, tc.want)
		}
	}
}
