package kubealloc

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/manager"
)

// A sandbox pod not yet Ready is reported as being made, so that every replica's view of the
// pool counts it so; a Ready one, a claimed one and one that ended are not.
func TestUnitInfoReportsPodsOnTheirWay(t *testing.T) {
	pod := func(state string, phase corev1.PodPhase, ready bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "fbx-1", Annotations: map[string]string{AnnotationState: state}},
			Status: corev1.PodStatus{Phase: phase}}
		if ready {
			p.Status.PodIP = "10.0.0.9"
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return p
	}
	a := &Allocator{o: Options{Endpoints: func(*corev1.Pod) (string, string, error) { return "tcp://i", "tcp://d", nil }}}
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"pending", pod(StateReady, corev1.PodPending, false), "creating"},
		{"running, not ready", pod(StateReady, corev1.PodRunning, false), "creating"},
		{"ready", pod(StateReady, corev1.PodRunning, true), ""},
		{"claimed", pod(StateClaimed, corev1.PodRunning, true), "claimed"},
		{"failed", pod(StateReady, corev1.PodFailed, false), ""},
	} {
		info, err := a.unitInfo(c.pod)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := info.Annotations[manager.AnnotationState]; got != c.want {
			t.Errorf("%s: state %q, want %q", c.name, got, c.want)
		}
	}
}
