package kubealloc

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// RuntimeClassGVisor is the only runtime class a sandbox pod template may name.
const RuntimeClassGVisor = "gvisor"

// ErrTemplate is wrapped by every refusal of TemplateFromPod and ParseTemplate.
var ErrTemplate = errors.New("sandbox pod template refused")

// ParseTemplate decodes a sandbox pod template (a v1 Pod in YAML or JSON, as the manager
// component renders into its ConfigMap; unknown fields are refused) and returns it as a
// Template with TemplateFromPod.
func ParseTemplate(data []byte) (Template, error) {
	var p corev1.Pod
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return Template{}, fmt.Errorf("%w: decoding: %w", ErrTemplate, err)
	}
	if p.Kind != "" && (p.Kind != "Pod" || p.APIVersion != "v1") {
		return Template{}, fmt.Errorf("%w: kind %s/%s, want v1 Pod", ErrTemplate, p.APIVersion, p.Kind)
	}
	return TemplateFromPod(&p)
}

// TemplateFromPod takes from p what a sandbox template may decide: the image, the
// container's resources and extra server args, nodeSelector and tolerations, image pull
// secrets, labels and annotations. BuildPod makes everything else and enforces the security settings
// (runtimeClassName gvisor, no service-account token, the server started as root inside
// gVisor with its commands run as SandboxUID, every capability dropped but
// ServerCapabilities, no privilege escalation, seccomp RuntimeDefault, read-only root
// filesystem, no host namespaces, ports init 7070 and data 7071). A template that states a different value
// for any of those, or asks for something BuildPod never grants (volumes, more
// containers, host ports, sysctls), is refused with an error naming the field. Fields that
// grant nothing (probes, enableServiceLinks, dnsPolicy, ...) are ignored: BuildPod sets its
// own.
func TemplateFromPod(p *corev1.Pod) (Template, error) {
	for _, check := range []func(*corev1.Pod) (field, why string){
		checkPodSpec, checkPodSecurity, checkContainer, checkContainerSecurity, checkPorts,
	} {
		if f, why := check(p); f != "" {
			return Template{}, refusal(f, why)
		}
	}
	c := p.Spec.Containers[0]
	args, err := serverArgs(c.Args)
	if err != nil {
		return Template{}, refusal(containerField("args"), err.Error())
	}
	if f, why := checkMetadata(p); f != "" {
		return Template{}, refusal(f, why)
	}
	t := Template{
		Image:       c.Image,
		ServerArgs:  args,
		Requests:    c.Resources.Requests,
		Limits:      c.Resources.Limits,
		Labels:      maps.Clone(p.Labels),
		Annotations: maps.Clone(p.Annotations),
	}
	s := p.Spec
	for i, r := range s.ImagePullSecrets {
		if r.Name == "" {
			return Template{}, refusal(fmt.Sprintf("spec.imagePullSecrets[%d].name", i), "empty")
		}
		t.ImagePullSecrets = append(t.ImagePullSecrets, r.Name)
	}
	if len(s.NodeSelector) > 0 || len(s.Tolerations) > 0 {
		t.Pool = &NodePool{NodeSelector: maps.Clone(s.NodeSelector), Tolerations: slices.Clone(s.Tolerations)}
	}
	return t, nil
}

// refusal is TemplateFromPod's error for field.
func refusal(field, why string) error {
	return fmt.Errorf("%w: %s: %s", ErrTemplate, field, why)
}

// containerField names a field of the sandbox container.
func containerField(f string) string { return "spec.containers[0]." + f }

// checkPodSpec returns the first field of the pod's spec that contradicts BuildPod or asks
// for what it never grants, and why, or "".
func checkPodSpec(p *corev1.Pod) (field, why string) {
	s := p.Spec
	switch {
	case s.RuntimeClassName != nil && *s.RuntimeClassName != RuntimeClassGVisor:
		return "spec.runtimeClassName", fmt.Sprintf("%q; sandbox pods run only under %q", *s.RuntimeClassName, RuntimeClassGVisor)
	case s.AutomountServiceAccountToken != nil && *s.AutomountServiceAccountToken:
		return "spec.automountServiceAccountToken", "true; sandbox pods get no service-account token"
	case s.HostNetwork || s.HostPID || s.HostIPC:
		return "spec.hostNetwork/hostPID/hostIPC", "set; sandbox pods share no host namespace"
	case len(s.Volumes) > 0:
		return "spec.volumes", fmt.Sprintf("%d volumes; a sandbox pod has only its workspace", len(s.Volumes))
	case len(s.InitContainers) > 0 || len(s.EphemeralContainers) > 0:
		return "spec.initContainers", "set; a sandbox pod runs only the sandbox server"
	case len(s.Containers) != 1:
		return "spec.containers", fmt.Sprintf("%d containers, want exactly one (the sandbox server)", len(s.Containers))
	case s.RestartPolicy != "" && s.RestartPolicy != corev1.RestartPolicyNever:
		return "spec.restartPolicy", fmt.Sprintf("%s; sandbox pods are single-use (Never)", s.RestartPolicy)
	case s.NodeName != "":
		return "spec.nodeName", "set; sandbox pods are placed by nodeSelector and tolerations"
	case s.ServiceAccountName != "" || s.DeprecatedServiceAccount != "":
		return "spec.serviceAccountName", "set; sandbox pods use no service account"
	}
	return "", ""
}

// checkPodSecurity checks the pod's security context.
func checkPodSecurity(p *corev1.Pod) (field, why string) {
	sc := p.Spec.SecurityContext
	if sc == nil {
		return "", ""
	}
	if f, why := identity(sc.RunAsNonRoot, sc.RunAsUser, sc.RunAsGroup, sc.SeccompProfile); f != "" {
		return "spec.securityContext." + f, why
	}
	switch {
	case sc.FSGroup != nil && *sc.FSGroup != SandboxUID:
		return "spec.securityContext.fsGroup", fmt.Sprintf("%d; the workspace belongs to group %d", *sc.FSGroup, SandboxUID)
	case len(sc.Sysctls) > 0:
		return "spec.securityContext.sysctls", "set; sandbox pods change no sysctl"
	}
	return "", ""
}

// checkContainer checks the sandbox container's image, command and mounts.
func checkContainer(p *corev1.Pod) (field, why string) {
	c := p.Spec.Containers[0]
	switch {
	case c.Image == "":
		return containerField("image"), "empty"
	case len(c.Command) > 0:
		return containerField("command"), "set; the image's entrypoint is the sandbox server"
	case len(c.VolumeMounts) > 0 || len(c.VolumeDevices) > 0:
		return containerField("volumeMounts"), "set; a sandbox pod has only its workspace"
	}
	return "", ""
}

// checkContainerSecurity checks the sandbox container's security context.
func checkContainerSecurity(p *corev1.Pod) (field, why string) {
	sc := p.Spec.Containers[0].SecurityContext
	if sc == nil {
		return "", ""
	}
	switch {
	case sc.Privileged != nil && *sc.Privileged:
		return containerField("securityContext.privileged"), "true; sandbox pods are never privileged"
	case sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation:
		return containerField("securityContext.allowPrivilegeEscalation"), "true; sandbox pods cannot gain privileges"
	case sc.ReadOnlyRootFilesystem != nil && !*sc.ReadOnlyRootFilesystem:
		return containerField("securityContext.readOnlyRootFilesystem"), "false; the root filesystem is read-only (the workspace is writable)"
	case sc.Capabilities != nil && slices.ContainsFunc(sc.Capabilities.Add, func(c corev1.Capability) bool {
		return !slices.Contains(ServerCapabilities, corev1.Capability(strings.TrimPrefix(string(c), "CAP_")))
	}):
		return containerField("securityContext.capabilities.add"), fmt.Sprintf("%v; sandbox pods drop every capability but %v", sc.Capabilities.Add, ServerCapabilities)
	case sc.Capabilities != nil && len(sc.Capabilities.Drop) > 0 && !slices.Contains(sc.Capabilities.Drop, "ALL"):
		return containerField("securityContext.capabilities.drop"), fmt.Sprintf("%v; sandbox pods drop ALL", sc.Capabilities.Drop)
	case sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount:
		return containerField("securityContext.procMount"), fmt.Sprintf("%s; sandbox pods use the default", *sc.ProcMount)
	}
	if f, why := identity(sc.RunAsNonRoot, sc.RunAsUser, sc.RunAsGroup, sc.SeccompProfile); f != "" {
		return containerField("securityContext." + f), why
	}
	return "", ""
}

// checkPorts allows only the init and data ports, on their numbers, over TCP, with no host
// port.
func checkPorts(p *corev1.Pod) (field, why string) {
	want := map[string]int32{"init": InitPort, "data": DataPort}
	for i, cp := range p.Spec.Containers[0].Ports {
		f := containerField("ports[" + strconv.Itoa(i) + "]")
		w, ok := want[cp.Name]
		switch {
		case !ok:
			return f, fmt.Sprintf("port %q (%d); a sandbox pod exposes only init %d and data %d", cp.Name, cp.ContainerPort, InitPort, DataPort)
		case cp.ContainerPort != w:
			return f, fmt.Sprintf("%s is %d; the sandbox server's %s port is %d (the network policy and the endpoints use it)", cp.Name, cp.ContainerPort, cp.Name, w)
		case cp.HostPort != 0 || cp.HostIP != "":
			return f, "host port set; sandbox pods bind no host port"
		case cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP:
			return f, fmt.Sprintf("protocol %s, want TCP", cp.Protocol)
		}
	}
	return "", ""
}

// checkMetadata refuses labels and annotations the allocator sets, and another app label.
func checkMetadata(p *corev1.Pod) (field, why string) {
	for k, v := range p.Labels {
		switch {
		case k == LabelApp && v != AppName:
			return "metadata.labels", fmt.Sprintf("%s=%s; sandbox pods are %s=%s (the informers and policies select them by it)", k, v, LabelApp, AppName)
		case k == LabelTemplate || k == legacyLabelState || k == LabelSandboxID || k == LabelTemplateHash:
			return "metadata.labels", fmt.Sprintf("%s is set by the allocator", k)
		}
	}
	for k := range p.Annotations {
		switch {
		case strings.HasPrefix(k, internalAnnotationPrefix):
			return "metadata.annotations", fmt.Sprintf("%s is set by the allocator", k)
		case k == AnnotationDoNotDisrupt:
			return "metadata.annotations", fmt.Sprintf("%s is set by the allocator on bound pods only (warm pods stay disruptable)", k)
		}
	}
	return "", ""
}

// identity checks the fields a pod's and a container's security context share: it returns
// the first one that contradicts BuildPod (relative to the securityContext) and why, or "".
func identity(nonRoot *bool, user, group *int64, seccomp *corev1.SeccompProfile) (field, why string) {
	switch {
	case nonRoot != nil && *nonRoot:
		return "runAsNonRoot", fmt.Sprintf("true; the sandbox server starts as root inside gVisor and runs its commands as %d", SandboxUID)
	case user != nil && *user != 0:
		return "runAsUser", fmt.Sprintf("%d; the sandbox server starts as root inside gVisor and runs its commands as %d", *user, SandboxUID)
	case group != nil && *group != 0:
		return "runAsGroup", fmt.Sprintf("%d; the sandbox server starts as group 0 inside gVisor and runs its commands as group %d", *group, SandboxUID)
	case seccomp != nil && seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault:
		return "seccompProfile.type", fmt.Sprintf("%s; sandbox pods use RuntimeDefault", seccomp.Type)
	}
	return "", ""
}

// serverArgs returns the template's fusebox-sandbox flags without the listen, workspace and
// command-user flags BuildPod sets itself, refusing those flags when they say something else.
func serverArgs(in []string) ([]string, error) {
	own := map[string]string{
		"init-listen": "tcp://0.0.0.0:" + strconv.Itoa(int(InitPort)),
		"data-listen": "tcp://0.0.0.0:" + strconv.Itoa(int(DataPort)),
		"workspace":   "/workspace",
		// Commands run apart from the server, always.
		"command-user": CommandUser,
	}
	var out []string
	for _, a := range in {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		w, ok := own[name]
		switch {
		case !strings.HasPrefix(a, "-") || !ok:
			out = append(out, a)
		case !hasValue:
			return nil, fmt.Errorf("%q: write -%s=VALUE", a, name)
		case value != w:
			return nil, fmt.Errorf("%q: the allocator sets -%s=%s", a, name, w)
		}
	}
	return out, nil
}
