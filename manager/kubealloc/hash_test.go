package kubealloc

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestTemplateHash: pods of one template hash alike whatever their ids, and every change to
// what goes into the pod (image, resources, server args, placement, labels, annotations,
// runtime class, pull secrets) changes the hash, which BuildPod puts on the pod.
func TestTemplateHash(t *testing.T) {
	base := func() PodSpec {
		return PodSpec{ID: "sb-1", Namespace: "ns", TemplateName: "default", Template: DefaultTemplate("registry.example/sandbox@sha256:aa"),
			RuntimeClassName: "gvisor", Pool: DefaultNodePool()}
	}
	h := TemplateHash(base())
	if len(h) != 16 {
		t.Fatalf("hash %q, want 16 hex digits (a label value)", h)
	}
	other := base()
	other.ID = "sb-2"
	if TemplateHash(other) != h {
		t.Error("the hash depends on the pod's id")
	}
	if got := BuildPod(base()).Labels[LabelTemplateHash]; got != h {
		t.Errorf("BuildPod's %s = %q, want %q", LabelTemplateHash, got, h)
	}
	seen := map[string]string{h: "base"}
	for name, edit := range map[string]func(*PodSpec){
		"image (a CVE fix)": func(s *PodSpec) { s.Template.Image = "registry.example/sandbox@sha256:bb" },
		"cpu request": func(s *PodSpec) {
			s.Template.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("256Mi")}
		},
		"memory limit": func(s *PodSpec) {
			s.Template.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}
		},
		"workspace size": func(s *PodSpec) { s.Template.WorkspaceSize = resource.MustParse("1Gi") },
		"server args":    func(s *PodSpec) { s.Template.ServerArgs = []string{"-max-file-bytes=4096"} },
		"template placement": func(s *PodSpec) {
			s.Template.Pool = &NodePool{NodeSelector: map[string]string{"sandbox.gke.io/runtime": "gvisor"}}
		},
		"node pool":     func(s *PodSpec) { s.Pool.NodeSelector = map[string]string{"fusebox.dev/pool": "other"} },
		"tolerations":   func(s *PodSpec) { s.Pool.Tolerations = nil },
		"labels":        func(s *PodSpec) { s.Template.Labels = map[string]string{"team": "ml"} },
		"annotations":   func(s *PodSpec) { s.Template.Annotations = map[string]string{"example.com/owner": "ml"} },
		"runtime class": func(s *PodSpec) { s.RuntimeClassName = "runsc" },
		"pull secrets":  func(s *PodSpec) { s.ImagePullSecrets = []string{"regcred"} },
		"template pull": func(s *PodSpec) { s.Template.ImagePullSecrets = []string{"team-cred"} },
		"template name": func(s *PodSpec) { s.TemplateName = "ml" },
		"namespace":     func(s *PodSpec) { s.Namespace = "other" },
		"node (tests)":  func(s *PodSpec) { s.NodeName = "kwok-node-0" },
	} {
		s := base()
		edit(&s)
		got := TemplateHash(s)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s: hash %s, as %s's", name, got, prev)
		}
		seen[got] = name
	}
}

// TestBoundPodsOnlyAreNotDisrupted: Karpenter's do-not-disrupt is on a bound pod's patch, never
// on a warm pod (even when a template sets it), and is the allocator's: never reported as the
// manager's nor removed by a rebind.
func TestBoundPodsOnlyAreNotDisrupted(t *testing.T) {
	s := PodSpec{ID: "sb-1", Namespace: "ns", TemplateName: "default", Template: DefaultTemplate("img"), RuntimeClassName: "gvisor"}
	s.Template.Annotations = map[string]string{AnnotationDoNotDisrupt: "true", "example.com/x": "y"}
	if v, ok := BuildPod(s).Annotations[AnnotationDoNotDisrupt]; ok {
		t.Errorf("a warm pod carries %s=%q", AnnotationDoNotDisrupt, v)
	}
	ann := boundAnnotations(map[string]string{"fusebox.dev/owner": "a", AnnotationDoNotDisrupt: "false"})
	if ann[AnnotationDoNotDisrupt] != "true" || ann[AnnotationState] != StateBound || ann["fusebox.dev/owner"] != "a" {
		t.Errorf("bound annotations %v", ann)
	}
	if m := managerAnnotations(map[string]string{AnnotationDoNotDisrupt: "true", "fusebox.dev/owner": "a"}); len(m) != 1 {
		t.Errorf("manager annotations %v, want the owner alone", m)
	}
}
