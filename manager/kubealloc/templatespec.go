package kubealloc

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fusebox-dev/fusebox/internal/templates"
)

// warmUpTimeout is the sandbox server's bound on a template's warm-up commands
// (server.DefaultWarmUpTimeout; TestFromSpec checks they agree).
const warmUpTimeout = 5 * time.Minute

// ErrTemplateSpec is wrapped by FromSpec's refusals of what a cluster cannot honour.
var ErrTemplateSpec = errors.New("template not supported in a cluster")

// FromSpec returns the pods of template spec (a valid templates.Spec) as base's (the default
// template: the sandbox image and the stack's sandbox settings) but for what spec declares:
//
//   - the sandbox container runs spec's image, with the server copied in from base's image
//     (Template.ServerImage), so that the image needs nothing of fusebox;
//   - cpu is the container's CPU request (a weight), cpuQuota its CPU limit, memory its
//     memory limit (and its request, where base requests more), workspace the size of the
//     memory-backed /workspace;
//   - processes and processBuffer are the server's -max-processes and -process-buffer-bytes;
//   - env, cwd and warm-up commands are the server's -env, -cwd and -warmup, and user its
//     -command-user, which the server resolves in the image's own /etc/passwd and /etc/group
//     (empty: SandboxUID, never the image's USER, which the pod does not run as);
//   - everything else (placement, pull secrets, labels, annotations, server limits) is base's.
//
// Refused (ErrTemplateSpec): an image that is an OCI layout (on the manager's host only), and
// limits.pids (a pod has no task limit of its own, only the kubelet's podPidsLimit for every
// pod of its node).
func FromSpec(spec templates.Spec, base Template) (Template, error) {
	if strings.HasPrefix(spec.Image, "/") {
		return Template{}, fmt.Errorf("%w: template %s: image %s is an OCI layout on one host: push it to a registry the nodes pull from and name it there by digest", ErrTemplateSpec, spec.Name, spec.Image)
	}
	if spec.Limits.Pids != 0 {
		return Template{}, fmt.Errorf("%w: template %s: limits.pids: a sandbox pod's tasks are bounded by its node's kubelet (podPidsLimit), not per template; leave it out", ErrTemplateSpec, spec.Name)
	}
	base = base.withDefaults()
	t := Template{
		Image:            spec.Image,
		ServerImage:      base.Image,
		ServerArgs:       slices.Clone(base.ServerArgs),
		Requests:         maps.Clone(base.Requests),
		Limits:           maps.Clone(base.Limits),
		WorkspaceSize:    base.WorkspaceSize,
		Labels:           maps.Clone(base.Labels),
		Annotations:      maps.Clone(base.Annotations),
		ImagePullSecrets: slices.Clone(base.ImagePullSecrets),
	}
	if base.Pool != nil {
		p := NodePool{NodeSelector: maps.Clone(base.Pool.NodeSelector), Tolerations: slices.Clone(base.Pool.Tolerations)}
		t.Pool = &p
	}
	if t.Requests == nil {
		t.Requests = corev1.ResourceList{}
	}
	if t.Limits == nil {
		t.Limits = corev1.ResourceList{}
	}
	for _, q := range []struct {
		field, value string
		set          func(resource.Quantity)
	}{
		{"cpu", spec.Limits.CPU, func(v resource.Quantity) { t.Requests[corev1.ResourceCPU] = v }},
		{"cpuQuota", spec.Limits.CPUQuota, func(v resource.Quantity) { t.Limits[corev1.ResourceCPU] = v }},
		{"memory", spec.Limits.Memory, func(v resource.Quantity) {
			t.Limits[corev1.ResourceMemory] = v
			if r, ok := t.Requests[corev1.ResourceMemory]; !ok || r.Cmp(v) > 0 {
				t.Requests[corev1.ResourceMemory] = v
			}
		}},
		{"workspace", spec.Limits.Workspace, func(v resource.Quantity) { t.WorkspaceSize = v }},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil {
			return Template{}, fmt.Errorf("template %s: limits.%s: %w", spec.Name, q.field, err)
		}
		q.set(v)
	}
	if cpu, ok := t.Requests[corev1.ResourceCPU]; ok {
		if quota, ok := t.Limits[corev1.ResourceCPU]; ok && quota.Cmp(cpu) < 0 {
			return Template{}, fmt.Errorf("%w: template %s: limits.cpuQuota %s is below its CPU request %s", ErrTemplateSpec, spec.Name, quota.String(), cpu.String())
		}
	}
	if mem, ok := t.Limits[corev1.ResourceMemory]; ok && t.WorkspaceSize.Cmp(mem) > 0 {
		return Template{}, fmt.Errorf("%w: template %s: the workspace (%s) is larger than the memory limit (%s), which counts it", ErrTemplateSpec, spec.Name, t.WorkspaceSize.String(), mem.String())
	}
	// The server's flag package keeps the last value of a flag: these come after base's.
	t.ServerArgs = append(t.ServerArgs, "-inherit-env")
	t.ServerArgs = append(t.ServerArgs, spec.Limits.ServerArgs()...)
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		t.ServerArgs = append(t.ServerArgs, "-env="+k+"="+spec.Env[k])
	}
	if spec.Cwd != "" {
		t.ServerArgs = append(t.ServerArgs, "-cwd="+spec.Cwd)
	}
	if spec.User != "" {
		t.ServerArgs = append(t.ServerArgs, "-command-user="+spec.User)
	}
	if len(spec.WarmUp) > 0 {
		b, err := json.Marshal(spec.WarmUp)
		if err != nil {
			return Template{}, fmt.Errorf("template %s: %w", spec.Name, err)
		}
		t.ServerArgs = append(t.ServerArgs, "-warmup="+string(b))
		t.WarmUpTimeout = warmUpTimeout
	}
	return t, nil
}
