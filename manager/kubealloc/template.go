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
// (runtimeClassName gvisor, no service-account token, non-root, every capability dropped,
// no privilege escalation, seccomp RuntimeDefault, read-only root filesystem, no host
// namespaces, ports init 7070 and data 7071). A template that states a different value
// for any of those, or asks for something BuildPod never grants (volumes, more
// containers, host ports, sysctls), is refused with an error naming the field. Fields that
// grant nothing (probes, enableServiceLinks, dnsPolicy, ...) are ignored: BuildPod sets its
// own.
func TemplateFromPod(p *corev1.Pod) (Template, error) {
	refuse := func(field, format string, args ...any) (Template, error) {
		return Template{}, fmt.Errorf("%w: %s: %s", ErrTemplate, field, fmt.Sprintf(format, args...))
	}
	s := p.Spec
	switch {
	case s.RuntimeClassName != nil && *s.RuntimeClassName != RuntimeClassGVisor:
		return refuse("spec.runtimeClassName", "%q; sandbox pods run only under %q", *s.RuntimeClassName, RuntimeClassGVisor)
	case s.AutomountServiceAccountToken != nil && *s.AutomountServiceAccountToken:
		return refuse("spec.automountServiceAccountToken", "true; sandbox pods get no service-account token")
	case s.HostNetwork || s.HostPID || s.HostIPC:
		return refuse("spec.hostNetwork/hostPID/hostIPC", "set; sandbox pods share no host namespace")
	case len(s.Volumes) > 0:
		return refuse("spec.volumes", "%d volumes; a sandbox pod has only its workspace", len(s.Volumes))
	case len(s.InitContainers) > 0 || len(s.EphemeralContainers) > 0:
		return refuse("spec.initContainers", "set; a sandbox pod runs only the sandbox server")
	case len(s.Containers) != 1:
		return refuse("spec.containers", "%d containers, want exactly one (the sandbox server)", len(s.Containers))
	case s.RestartPolicy != "" && s.RestartPolicy != corev1.RestartPolicyNever:
		return refuse("spec.restartPolicy", "%s; sandbox pods are single-use (Never)", s.RestartPolicy)
	case s.NodeName != "":
		return refuse("spec.nodeName", "set; sandbox pods are placed by nodeSelector and tolerations")
	case s.ServiceAccountName != "" || s.DeprecatedServiceAccount != "":
		return refuse("spec.serviceAccountName", "set; sandbox pods use no service account")
	}
	if sc := s.SecurityContext; sc != nil {
		if f, why := identity(sc.RunAsNonRoot, sc.RunAsUser, sc.RunAsGroup, sc.SeccompProfile); f != "" {
			return refuse("spec.securityContext."+f, "%s", why)
		}
		switch {
		case sc.FSGroup != nil && *sc.FSGroup != SandboxUID:
			return refuse("spec.securityContext.fsGroup", "%d; the workspace belongs to group %d", *sc.FSGroup, SandboxUID)
		case len(sc.Sysctls) > 0:
			return refuse("spec.securityContext.sysctls", "set; sandbox pods change no sysctl")
		}
	}
	c := s.Containers[0]
	field := func(f string) string { return "spec.containers[0]." + f }
	if c.Image == "" {
		return refuse(field("image"), "empty")
	}
	if len(c.Command) > 0 {
		return refuse(field("command"), "set; the image's entrypoint is the sandbox server")
	}
	if len(c.VolumeMounts) > 0 || len(c.VolumeDevices) > 0 {
		return refuse(field("volumeMounts"), "set; a sandbox pod has only its workspace")
	}
	if sc := c.SecurityContext; sc != nil {
		switch {
		case sc.Privileged != nil && *sc.Privileged:
			return refuse(field("securityContext.privileged"), "true; sandbox pods are never privileged")
		case sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation:
			return refuse(field("securityContext.allowPrivilegeEscalation"), "true; sandbox pods cannot gain privileges")
		case sc.ReadOnlyRootFilesystem != nil && !*sc.ReadOnlyRootFilesystem:
			return refuse(field("securityContext.readOnlyRootFilesystem"), "false; the root filesystem is read-only (the workspace is writable)")
		case sc.Capabilities != nil && len(sc.Capabilities.Add) > 0:
			return refuse(field("securityContext.capabilities.add"), "%v; sandbox pods drop every capability", sc.Capabilities.Add)
		case sc.Capabilities != nil && len(sc.Capabilities.Drop) > 0 && !slices.Contains(sc.Capabilities.Drop, "ALL"):
			return refuse(field("securityContext.capabilities.drop"), "%v; sandbox pods drop ALL", sc.Capabilities.Drop)
		case sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount:
			return refuse(field("securityContext.procMount"), "%s; sandbox pods use the default", *sc.ProcMount)
		}
		if f, why := identity(sc.RunAsNonRoot, sc.RunAsUser, sc.RunAsGroup, sc.SeccompProfile); f != "" {
			return refuse(field("securityContext."+f), "%s", why)
		}
	}
	want := map[string]int32{"init": InitPort, "data": DataPort}
	for i, cp := range c.Ports {
		f := field("ports[" + strconv.Itoa(i) + "]")
		w, ok := want[cp.Name]
		switch {
		case !ok:
			return refuse(f, "port %q (%d); a sandbox pod exposes only init %d and data %d", cp.Name, cp.ContainerPort, InitPort, DataPort)
		case cp.ContainerPort != w:
			return refuse(f, "%s is %d; the sandbox server's %s port is %d (the network policy and the endpoints use it)", cp.Name, cp.ContainerPort, cp.Name, w)
		case cp.HostPort != 0 || cp.HostIP != "":
			return refuse(f, "host port set; sandbox pods bind no host port")
		case cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP:
			return refuse(f, "protocol %s, want TCP", cp.Protocol)
		}
	}
	args, err := serverArgs(c.Args)
	if err != nil {
		return refuse(field("args"), "%v", err)
	}
	for k, v := range p.Labels {
		switch {
		case k == LabelApp && v != AppName:
			return refuse("metadata.labels", "%s=%s; sandbox pods are %s=%s (the informers and policies select them by it)", k, v, LabelApp, AppName)
		case k == LabelTemplate || k == legacyLabelState || k == LabelSandboxID:
			return refuse("metadata.labels", "%s is set by the allocator", k)
		}
	}
	for k := range p.Annotations {
		if strings.HasPrefix(k, internalAnnotationPrefix) {
			return refuse("metadata.annotations", "%s is set by the allocator", k)
		}
	}
	t := Template{
		Image:       c.Image,
		ServerArgs:  args,
		Requests:    c.Resources.Requests,
		Limits:      c.Resources.Limits,
		Labels:      maps.Clone(p.Labels),
		Annotations: maps.Clone(p.Annotations),
	}
	for i, r := range s.ImagePullSecrets {
		if r.Name == "" {
			return refuse(fmt.Sprintf("spec.imagePullSecrets[%d].name", i), "empty")
		}
		t.ImagePullSecrets = append(t.ImagePullSecrets, r.Name)
	}
	if len(s.NodeSelector) > 0 || len(s.Tolerations) > 0 {
		t.Pool = &NodePool{NodeSelector: maps.Clone(s.NodeSelector), Tolerations: slices.Clone(s.Tolerations)}
	}
	return t, nil
}

// identity checks the fields a pod's and a container's security context share: it returns
// the first one that contradicts BuildPod (relative to the securityContext) and why, or "".
func identity(nonRoot *bool, user, group *int64, seccomp *corev1.SeccompProfile) (field, why string) {
	switch {
	case nonRoot != nil && !*nonRoot:
		return "runAsNonRoot", "false; the sandbox server runs as a non-root user"
	case user != nil && *user != SandboxUID:
		return "runAsUser", fmt.Sprintf("%d; the sandbox server runs as %d", *user, SandboxUID)
	case group != nil && *group != SandboxUID:
		return "runAsGroup", fmt.Sprintf("%d; the sandbox server runs as group %d", *group, SandboxUID)
	case seccomp != nil && seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault:
		return "seccompProfile.type", fmt.Sprintf("%s; sandbox pods use RuntimeDefault", seccomp.Type)
	}
	return "", ""
}

// serverArgs returns the template's fusebox-sandbox flags without the listen flags BuildPod
// sets itself, refusing listen flags that say something else.
func serverArgs(in []string) ([]string, error) {
	own := map[string]string{
		"init-listen": "tcp://0.0.0.0:" + strconv.Itoa(int(InitPort)),
		"data-listen": "tcp://0.0.0.0:" + strconv.Itoa(int(DataPort)),
		"workspace":   "/workspace",
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
