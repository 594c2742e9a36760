package kubealloc

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/sandbox-server/server"
)

// TestFromSpec: a template's pods run its image with the server copied in from the base's
// image, its limits replace the base's resources field by field, its env, cwd, user and
// warm-up become the server's flags after the base's, and what a cluster cannot honour is
// refused with the template's name.
func TestFromSpec(t *testing.T) {
	base := DefaultTemplate("localhost/fusebox/sandbox@sha256:" + strings.Repeat("b", 64))
	base.ServerArgs = []string{"-max-file-bytes=1000"}
	base.ImagePullSecrets = []string{"pull"}
	spec := templates.Spec{Name: "py", Image: "localhost/py@sha256:" + strings.Repeat("a", 64), User: "app:staff",
		Limits: templates.Limits{CPU: "500m", CPUQuota: "2", Memory: "128Mi", Workspace: "64Mi", Processes: 2, ProcessBuffer: "1Mi"},
		Env:    map[string]string{"B": "2", "A": "1"}, Cwd: "/srv"}
	tm, err := FromSpec(spec, base)
	if err != nil {
		t.Fatal(err)
	}
	if tm.Image != spec.Image || tm.ServerImage != base.Image || !slices.Equal(tm.ImagePullSecrets, []string{"pull"}) {
		t.Errorf("images %s, server %s, pull secrets %v", tm.Image, tm.ServerImage, tm.ImagePullSecrets)
	}
	for _, c := range []struct {
		name string
		got  resource.Quantity
		want string
	}{
		{"cpu request", tm.Requests[corev1.ResourceCPU], "500m"},
		{"cpu limit", tm.Limits[corev1.ResourceCPU], "2"},
		{"memory limit", tm.Limits[corev1.ResourceMemory], "128Mi"},
		{"memory request (the base's 256Mi, above the limit)", tm.Requests[corev1.ResourceMemory], "128Mi"},
		{"workspace", tm.WorkspaceSize, "64Mi"},
	} {
		if c.got.Cmp(resource.MustParse(c.want)) != 0 {
			t.Errorf("%s %s, want %s", c.name, c.got.String(), c.want)
		}
	}
	if base.Limits.Cpu().Value() != 0 || base.Requests.Memory().Cmp(resource.MustParse("256Mi")) != 0 {
		t.Errorf("the base template changed: %+v", base)
	}
	want := []string{"-max-file-bytes=1000", "-inherit-env", "-max-processes=2", "-process-buffer-bytes=1048576", "-env=A=1", "-env=B=2", "-cwd=/srv", "-command-user=app:staff"}
	if !slices.Equal(tm.ServerArgs, want) || tm.WarmUpTimeout != 0 {
		t.Errorf("server args %q (warm-up timeout %v), want %q", tm.ServerArgs, tm.WarmUpTimeout, want)
	}
	spec.WarmUp = []templates.Command{{Argv: []string{"python3", "-c", "import os"}}}
	warm, err := FromSpec(spec, base)
	if err != nil {
		t.Fatal(err)
	}
	if got := warm.ServerArgs[len(warm.ServerArgs)-1]; got != `-warmup=[{"argv":["python3","-c","import os"]}]` || warm.WarmUpTimeout != server.DefaultWarmUpTimeout {
		t.Errorf("warm-up flag %s, timeout %v (the server's bound: %v)", got, warm.WarmUpTimeout, server.DefaultWarmUpTimeout)
	}
	spec.WarmUp = nil
	for name, change := range map[string]func(*templates.Spec){
		"pids":      func(s *templates.Spec) { s.Limits.Pids = 64 },
		"layout":    func(s *templates.Spec) { s.Image = "/layouts/py@sha256:" + strings.Repeat("a", 64) },
		"quota":     func(s *templates.Spec) { s.Limits.CPUQuota = "100m" },
		"workspace": func(s *templates.Spec) { s.Limits.Workspace = "1Gi" },
	} {
		s := spec
		change(&s)
		if _, err := FromSpec(s, base); !errors.Is(err, ErrTemplateSpec) || !strings.Contains(err.Error(), "template py") {
			t.Errorf("%s: %v, want ErrTemplateSpec naming the template", name, err)
		}
	}
}

// TestTemplateImagePod: a template image's pod copies the server from the sandbox image in an
// init container that holds no capability, and runs it from a read-only volume in the
// template's image; the default template's pod has neither, and the two hash apart.
func TestTemplateImagePod(t *testing.T) {
	base := DefaultTemplate("localhost/fusebox/sandbox@sha256:" + strings.Repeat("b", 64))
	tm, err := FromSpec(templates.Spec{Name: "py", Image: "localhost/py@sha256:" + strings.Repeat("a", 64)}, base)
	if err != nil {
		t.Fatal(err)
	}
	spec := PodSpec{ID: "sb-1", Namespace: "sandboxes", TemplateName: "py", Template: tm, RuntimeClassName: "gvisor", Pool: DefaultNodePool()}
	// Pods of one template are made and sent at once (the pool's refill): under -race, they
	// share no Quantity, which caches its string when first printed (as the client's
	// protobuf encoding prints it).
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for _, v := range BuildPod(spec).Spec.Volumes {
				_ = v.EmptyDir.SizeLimit.String()
			}
		})
	}
	wg.Wait()
	p := BuildPod(spec)
	if len(p.Spec.InitContainers) != 1 {
		t.Fatalf("init containers %+v, want the server's installer", p.Spec.InitContainers)
	}
	in, c := p.Spec.InitContainers[0], p.Spec.Containers[0]
	if in.Image != base.Image || !slices.Equal(in.Command, []string{"cp", ServerPath, ServerDir + "/fusebox-sandbox"}) ||
		len(in.SecurityContext.Capabilities.Add) != 0 || !*in.SecurityContext.ReadOnlyRootFilesystem || *in.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("installer %+v", in)
	}
	if c.Image != tm.Image || !slices.Equal(c.Command, []string{ServerDir + "/fusebox-sandbox"}) {
		t.Errorf("sandbox container runs %s %q", c.Image, c.Command)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == ServerDir {
			mounted = m.ReadOnly
		}
	}
	if !mounted {
		t.Errorf("the server volume is not mounted read-only: %+v", c.VolumeMounts)
	}
	if len(p.Spec.Volumes) != 2 || p.Spec.Volumes[1].EmptyDir == nil || p.Spec.Volumes[1].EmptyDir.Medium != "" {
		t.Errorf("volumes %+v, want the workspace and a disk-backed server volume", p.Spec.Volumes)
	}
	def := BuildPod(PodSpec{ID: "sb-2", Namespace: "sandboxes", TemplateName: "default", Template: base, RuntimeClassName: "gvisor", Pool: DefaultNodePool()})
	if len(def.Spec.InitContainers) != 0 || def.Spec.Containers[0].Command != nil || len(def.Spec.Volumes) != 1 {
		t.Errorf("the default template's pod changed: %+v", def.Spec)
	}
	if p.Labels[LabelTemplateHash] == def.Labels[LabelTemplateHash] {
		t.Error("a template image's pods hash as the default's")
	}
}

// A pod whose image cannot be pulled, or whose server installer failed, says so by container
// and image.
func TestPodTrouble(t *testing.T) {
	p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
		Name: ContainerName, Image: "localhost/py@sha256:aa",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}},
	}}}}
	if got := podStuck(p); !strings.Contains(got, "container sandbox (image localhost/py@sha256:aa): ImagePullBackOff") {
		t.Errorf("podStuck = %q", got)
	}
	p.Status.ContainerStatuses[0].State.Waiting.Reason = "ContainerCreating"
	if got := podStuck(p); got != "" {
		t.Errorf("a container being created is stuck: %q", got)
	}
	p.Status.Phase = corev1.PodFailed
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: InstallerName, Image: "sandbox",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "cp: cannot stat"}}}}
	if got := endReason(p); !strings.Contains(got, "init container install-server (image sandbox) failed: exit code 1") {
		t.Errorf("endReason = %q", got)
	}
}
