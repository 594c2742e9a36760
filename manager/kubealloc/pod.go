package kubealloc

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels and annotations on sandbox pods.
const (
	// LabelApp selects every sandbox pod (the informers watch only these).
	LabelApp       = "app.kubernetes.io/name"
	AppName        = "fusebox-sandbox"
	LabelTemplate  = "fusebox.dev/template"
	LabelSandboxID = "fusebox.dev/sandbox-id"
	// LabelTemplateHash is TemplateHash of the pod's template as it was when the pod was
	// made: a pool is the ready pods of one template name and hash, so that a replica started
	// with a changed template (a new image: a CVE fix) never hands out a pod of the old one.
	LabelTemplateHash = "fusebox.dev/template-hash"

	// The values of AnnotationState.
	StateReady   = "ready"   // warm: claimable once the pod is Ready
	StateClaimed = "claimed" // taken by one replica's Claim
	StateBound   = "bound"   // the manager stored a lease (Annotate)

	// internalAnnotationPrefix marks annotations the allocator owns; List hides them and
	// Annotate never replaces them.
	internalAnnotationPrefix = "kube.fusebox.dev/"
	// AnnotationState is StateReady, StateClaimed or StateBound. It is an annotation, not a
	// label: a pod's labels are what network policy selects by, and a change of them makes
	// the network plugin recompute (kube-router: a full sync of its rules; Cilium: a new
	// security identity for the pod) twice per allocation, beside the allocation.
	AnnotationState = internalAnnotationPrefix + "state"
	// AnnotationClaimedBy is the identity of the replica whose Claim took the pod.
	AnnotationClaimedBy = internalAnnotationPrefix + "claimed-by"
	// AnnotationClaimedAt is when (RFC 3339) it was taken.
	AnnotationClaimedAt = internalAnnotationPrefix + "claimed-at"
	// AnnotationCreateNonce is a random value per Create call: it tells a pod this call
	// created (in an attempt whose response was lost) from one of the same name made by
	// someone else.
	AnnotationCreateNonce = internalAnnotationPrefix + "create-nonce"

	// AnnotationDoNotDisrupt, "true" on a bound pod only, stops Karpenter from disrupting its
	// node voluntarily (consolidation, drift) while an agent holds the sandbox; warm pods do
	// not carry it, so that a node holding only warm pods can still be consolidated or
	// replaced. Karpenter's "Well-Known Annotations" reference: on a pod, it blocks
	// consolidation of the pod's node, and drift unless the NodeClaim sets a
	// terminationGracePeriod; it does not block expiration, repair, or forceful termination
	// once the terminationGracePeriod elapses.
	AnnotationDoNotDisrupt = "karpenter.sh/do-not-disrupt"
)

// ContainerName is the sandbox container's name: the sandbox server's.
const ContainerName = "sandbox"

// Ports of the sandbox server inside the pod.
const (
	InitPort int32 = 7070
	DataPort int32 = 7071
	// SandboxUID is the user (and group) commands run as, and whom the workspace belongs
	// to. The sandbox server starts as root inside gVisor and works as this user, keeping
	// root as its real and saved user (fusebox-sandbox -command-user, package privsep), so
	// that a command can neither signal the server, trace it nor read its /proc files.
	SandboxUID int64 = 65532
)

// ServerCapabilities are the only capabilities the sandbox container keeps (every other is
// dropped): what the server needs to switch each new command to SandboxUID, after which the
// command holds none. Pod Security "baseline" allows both; "restricted" allows neither (and
// no root user), so the sandbox namespace enforces baseline.
var ServerCapabilities = []corev1.Capability{"SETUID", "SETGID"}

// CommandUser is fusebox-sandbox's -command-user: SandboxUID as user and group.
var CommandUser = strconv.FormatInt(SandboxUID, 10) + ":" + strconv.FormatInt(SandboxUID, 10)

// Template is how sandbox pods of one template are made.
type Template struct {
	// Image is what the sandbox container runs: without ServerImage, an image holding
	// fusebox-sandbox as its entrypoint (the sandbox image); with it, any image (a template's),
	// which needs nothing of fusebox. Required.
	Image string
	// ServerImage, when set, holds fusebox-sandbox at ServerPath (the sandbox image): an init
	// container from it copies the server into the pod's server volume, which the sandbox
	// container mounts read-only at ServerDir and runs the server from, in Image's root.
	ServerImage string
	// WarmUpTimeout is added to Options.ReadyTimeout for this template's pods: the bound of
	// the template's warm-up commands, which the server runs before the pod is Ready.
	WarmUpTimeout time.Duration
	// ServerArgs are extra fusebox-sandbox flags (limits); they come after the allocator's own
	// and so override them (Go's flag package keeps the last value).
	ServerArgs []string
	// Requests and Limits of the sandbox container; DefaultTemplate's when nil.
	Requests corev1.ResourceList
	Limits   corev1.ResourceList
	// WorkspaceSize bounds the memory-backed /workspace (counted against the memory limit).
	WorkspaceSize resource.Quantity
	// Pool, when set, places this template's pods instead of Options.Pool.
	Pool *NodePool
	// Labels and Annotations are added to every pod; the allocator's own keys are set over
	// them (TemplateFromPod refuses templates that set those).
	Labels, Annotations map[string]string
	// ImagePullSecrets name Secrets in the sandbox namespace for a private registry.
	ImagePullSecrets []string
}

// DefaultTemplate is 250m/256Mi requested, a 1Gi memory limit, a 512Mi workspace, and no CPU
// limit: a CFS quota stalls gVisor's bursts of host threads for the rest of its period, so the
// CPU request (a weight) is what divides a busy node.
func DefaultTemplate(image string) Template {
	return Template{
		Image: image,
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("250m"),
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("1Gi"),
		},
		WorkspaceSize: resource.MustParse("512Mi"),
	}
}

// NodePool is where sandbox pods run: a dedicated, tainted node pool.
type NodePool struct {
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
}

// DefaultNodePool selects fusebox.dev/pool=sandbox and tolerates the fusebox.dev/sandbox taint.
func DefaultNodePool() NodePool {
	return NodePool{
		NodeSelector: map[string]string{"fusebox.dev/pool": "sandbox"},
		Tolerations: []corev1.Toleration{{
			Key: "fusebox.dev/sandbox", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
		}},
	}
}

// PodSpec is the input of BuildPod.
type PodSpec struct {
	ID, Namespace, TemplateName string
	Template                    Template
	RuntimeClassName            string
	Pool                        NodePool
	// NodeName binds the pod to a node directly (tests without a scheduler); empty in
	// production.
	NodeName string
	// ImagePullSecrets name Secrets in Namespace for pulling the image from a private
	// registry (the template's are added).
	ImagePullSecrets []string
}

// BuildPod returns the sandbox pod: gVisor runtime class, no service-account token, the
// server started as root inside gVisor with every capability dropped but
// ServerCapabilities and its commands run as SandboxUID (privsep), no privilege escalation,
// seccomp RuntimeDefault, read-only
// root filesystem, no host namespaces or host paths, a memory-backed workspace, resource
// requests and limits, the sandbox node pool (the template's, else PodSpec.Pool), the
// template's labels and annotations under the allocator's own, and a readiness probe on the init port (Ready
// therefore means "init endpoint accepts connections"). Pods are single-use: restartPolicy
// Never.
func BuildPod(s PodSpec) *corev1.Pod {
	p := buildPod(s)
	p.Labels[LabelTemplateHash] = TemplateHash(s)
	return p
}

// TemplateHash is a hash of everything BuildPod puts into a pod of s but its id: the
// template's image, resources, server args, placement, labels and annotations, and the
// allocator's own settings (runtime class, node pool, pull secrets) and pod spec. Pods of
// equal hashes are interchangeable; a manager started with a template of another hash drains
// the warm pods of the old one (DrainOutdated). It is 16 hex digits of a SHA-256.
func TemplateHash(s PodSpec) string {
	s.ID = ""
	b, err := json.Marshal(buildPod(s))
	if err != nil {
		panic(fmt.Sprintf("kubealloc: encoding a pod: %v", err)) // a corev1.Pod always encodes
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// buildPod is BuildPod without the template hash.
func buildPod(s PodSpec) *corev1.Pod {
	t := s.Template.withDefaults()
	pool := s.Pool
	if t.Pool != nil {
		pool = *t.Pool
	}
	no := false
	root, uid := int64(0), SandboxUID
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        s.ID,
			Namespace:   s.Namespace,
			Labels:      s.labels(),
			Annotations: s.annotations(),
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:             &s.RuntimeClassName,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			RestartPolicy:                corev1.RestartPolicyNever,
			NodeName:                     s.NodeName,
			NodeSelector:                 maps.Clone(pool.NodeSelector),
			Tolerations:                  slices.Clone(pool.Tolerations),
			ImagePullSecrets:             s.pullSecrets(),
			HostNetwork:                  false,
			HostPID:                      false,
			HostIPC:                      false,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &no,
				RunAsUser:      &root,
				RunAsGroup:     &root,
				FSGroup:        &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: serverInstaller(t),
			Containers:     []corev1.Container{sandboxContainer(t)},
			Volumes:        volumes(t),
		},
	}
}

// Where a template image's pod gets its server (Template.ServerImage).
const (
	// ServerPath is where the sandbox image holds fusebox-sandbox (internal/image).
	ServerPath = "/usr/local/bin/fusebox-sandbox"
	// ServerDir is where the sandbox container of a template image mounts the server volume,
	// read-only; the server runs as ServerDir/fusebox-sandbox.
	ServerDir = "/fusebox"
	// InstallerName is the init container that copies the server into the server volume.
	InstallerName = "install-server"
	serverVolume  = "fusebox-server"
)

// serverInstaller is, for a template image (t.ServerImage set), the init container that copies
// fusebox-sandbox from the sandbox image into the server volume: run as root inside gVisor
// (the copy belongs to root, so that no command can replace it even where the volume were
// writable) with every capability dropped, a read-only root filesystem and the sandbox
// image's own cp. nil otherwise.
func serverInstaller(t Template) []corev1.Container {
	if t.ServerImage == "" {
		return nil
	}
	return []corev1.Container{{
		Name:    InstallerName,
		Image:   t.ServerImage,
		Command: []string{"cp", ServerPath, ServerDir + "/fusebox-sandbox"},
		// Not the image's working directory, which a read-only root may lack.
		WorkingDir: ServerDir,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
		SecurityContext: rootContainerSecurity(nil),
		VolumeMounts:    []corev1.VolumeMount{{Name: serverVolume, MountPath: ServerDir}},
	}}
}

// volumes are the workspace and, for a template image, the server volume.
func volumes(t Template) []corev1.Volume {
	v := []corev1.Volume{workspaceVolume(t.WorkspaceSize)}
	if t.ServerImage != "" {
		// One static binary. A Quantity of each pod's own: one caches its string when
		// printed, so pods made at once must not share one.
		size := resource.MustParse("128Mi")
		v = append(v, corev1.Volume{Name: serverVolume, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size},
		}})
	}
	return v
}

// withDefaults is t with DefaultTemplate's requests, limits and workspace size where t has
// none.
func (t Template) withDefaults() Template {
	def := DefaultTemplate(t.Image)
	if t.Requests == nil {
		t.Requests = def.Requests
	}
	if t.Limits == nil {
		t.Limits = def.Limits
	}
	if t.WorkspaceSize.IsZero() {
		t.WorkspaceSize = def.WorkspaceSize
	}
	return t
}

// labels are the template's labels under the allocator's own.
func (s PodSpec) labels() map[string]string {
	labels := maps.Clone(s.Template.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, map[string]string{
		LabelApp:       AppName,
		LabelTemplate:  s.TemplateName,
		LabelSandboxID: s.ID,
	})
	return labels
}

// annotations are the template's annotations with the pod's state: ready (warm). A warm pod
// never carries AnnotationDoNotDisrupt (only a bound one does; TemplateFromPod refuses it).
func (s PodSpec) annotations() map[string]string {
	annotations := maps.Clone(s.Template.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, AnnotationDoNotDisrupt)
	annotations[AnnotationState] = StateReady
	return annotations
}

// pullSecrets are the spec's image pull secrets, then the template's, each once.
func (s PodSpec) pullSecrets() []corev1.LocalObjectReference {
	var pull []corev1.LocalObjectReference
	for _, n := range append(slices.Clone(s.ImagePullSecrets), s.Template.ImagePullSecrets...) {
		if !slices.Contains(pull, corev1.LocalObjectReference{Name: n}) {
			pull = append(pull, corev1.LocalObjectReference{Name: n})
		}
	}
	return pull
}

// sandboxContainer runs the sandbox server on the init and data ports, started as root
// inside gVisor with every capability dropped but ServerCapabilities and its commands run as
// SandboxUID, and a read-only root filesystem, Ready once its init port accepts connections
// (for a template image, the server is the read-only server volume's, in the image's root);
// the template's server args come last and so override the allocator's (but for
// -command-user, which TemplateFromPod refuses with any other value).
func sandboxContainer(t Template) corev1.Container {
	args := append([]string{
		"-init-listen=tcp://0.0.0.0:" + strconv.Itoa(int(InitPort)),
		"-data-listen=tcp://0.0.0.0:" + strconv.Itoa(int(DataPort)),
		"-workspace=/workspace",
		"-command-user=" + CommandUser,
		"-idle-ttl=24h", // a warm pod waits in the pool far longer than the server's default
	}, t.ServerArgs...)
	c := corev1.Container{
		Name:  ContainerName,
		Image: t.Image,
		Args:  args,
		Ports: []corev1.ContainerPort{
			{Name: "init", ContainerPort: InitPort, Protocol: corev1.ProtocolTCP},
			{Name: "data", ContainerPort: DataPort, Protocol: corev1.ProtocolTCP},
		},
		Resources:       corev1.ResourceRequirements{Requests: t.Requests, Limits: t.Limits},
		SecurityContext: rootContainerSecurity(ServerCapabilities),
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("init")}},
			PeriodSeconds: 1,
		},
		VolumeMounts: []corev1.VolumeMount{{Name: "workspace", MountPath: "/workspace"}},
	}
	if t.ServerImage != "" {
		// The image's entrypoint and working directory are not used: the server runs in the
		// workspace, which always exists, where the image's WORKDIR might not under a
		// read-only root.
		c.Command, c.WorkingDir = []string{ServerDir + "/fusebox-sandbox"}, "/workspace"
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: serverVolume, MountPath: ServerDir, ReadOnly: true})
	}
	return c
}

// rootContainerSecurity is a sandbox pod container's security context: root inside gVisor,
// every capability dropped but add, no privilege escalation, a read-only root filesystem,
// seccomp RuntimeDefault.
func rootContainerSecurity(add []corev1.Capability) *corev1.SecurityContext {
	no, yes := false, true
	root := int64(0)
	return &corev1.SecurityContext{
		RunAsNonRoot:             &no,
		RunAsUser:                &root,
		RunAsGroup:               &root,
		AllowPrivilegeEscalation: &no,
		Privileged:               &no,
		ReadOnlyRootFilesystem:   &yes,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: slices.Clone(add)},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// workspaceVolume is the memory-backed workspace of size (counted against the memory limit).
func workspaceVolume(size resource.Quantity) corev1.Volume {
	return corev1.Volume{
		Name: "workspace",
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: &size,
		}},
	}
}

// podReady reports whether p is Running, Ready, has an IP and is not being deleted.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podEnded reports whether p can never become Ready.
func podEnded(p *corev1.Pod) bool {
	return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// legacyLabelState is the label under which pods made by earlier versions carry their state
// (now AnnotationState): read, never written, and refused in templates.
const legacyLabelState = "fusebox.dev/state"

// podState is pod p's AnnotationState (for a pod made before it existed, its legacy label).
func podState(p *corev1.Pod) string {
	if s, ok := p.Annotations[AnnotationState]; ok {
		return s
	}
	return p.Labels[legacyLabelState]
}

// serverEnded returns why pod p's sandbox server is no longer serving, for people, or "" while
// it may be: its container terminated or restarted (a crash, the OOM killer, a kill through
// the runtime), or the pod failed or finished (evicted, its node lost). The kubelet reports
// it in the pod's status, which the informer delivers.
func serverEnded(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name != ContainerName {
			continue
		}
		if t := c.State.Terminated; t != nil {
			return "sandbox server exited: " + termination(t)
		}
		if c.RestartCount > 0 {
			last := "unknown"
			if t := c.LastTerminationState.Terminated; t != nil {
				last = termination(t)
			}
			return fmt.Sprintf("sandbox server restarted %d times (it had exited: %s)", c.RestartCount, last)
		}
	}
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		why := "sandbox pod " + strings.ToLower(string(p.Status.Phase))
		if p.Status.Reason != "" {
			why += ": " + p.Status.Reason
		}
		if p.Status.Message != "" {
			why += ": " + truncate(p.Status.Message)
		}
		return why
	}
	return ""
}

// stuckReasons are the waiting reasons of a container that does not start without a change to
// its pod or its image: the kubelet keeps trying, but a pod that shows one is not waited for.
var stuckReasons = map[string]bool{
	"ImagePullBackOff":           true, // a pull failed and the kubelet backs off
	"ErrImageNeverPull":          true,
	"InvalidImageName":           true,
	"CreateContainerConfigError": true,
	"RunContainerError":          true, // the runtime could not start it (no such binary, ...)
}

// podStuck returns why pod p's containers cannot start (an image that cannot be pulled, an
// invalid image name, a container the runtime refuses), naming the container and its image,
// or "".
func podStuck(p *corev1.Pod) string {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range list {
			if w := c.State.Waiting; w != nil && stuckReasons[w.Reason] {
				return fmt.Sprintf("container %s (image %s): %s: %s", c.Name, c.Image, w.Reason, truncate(w.Message))
			}
		}
	}
	return ""
}

// endReason describes why pod p ended before it was Ready: an init container (the server's
// installer) that failed, else the sandbox server's end (serverEnded), else its phase.
func endReason(p *corev1.Pod) string {
	for _, c := range p.Status.InitContainerStatuses {
		if t := c.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("init container %s (image %s) failed: %s", c.Name, c.Image, termination(t))
		}
	}
	if why := serverEnded(p); why != "" {
		return why
	}
	return fmt.Sprintf("phase %s", p.Status.Phase)
}

// termination describes a terminated container's end.
func termination(t *corev1.ContainerStateTerminated) string {
	s := fmt.Sprintf("exit code %d", t.ExitCode)
	if t.Signal != 0 {
		s += fmt.Sprintf(", signal %d", t.Signal)
	}
	if t.Reason != "" {
		s += " (" + t.Reason + ")"
	}
	if t.Message != "" {
		s += ": " + truncate(t.Message)
	}
	return s
}

// maxReason bounds the kubelet's or the container's message in a reason: it is shown in
// List and kept while the unit is listed.
const maxReason = 256

func truncate(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxReason {
		return s[:maxReason] + "..."
	}
	return s
}
