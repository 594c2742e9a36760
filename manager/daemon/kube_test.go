package daemon

import (
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
)

// podFastPath is the -fast-path a sandbox pod's server runs with: the last one in BuildPod's
// arguments (fusebox-sandbox's flag package keeps the last value), else the server's
// default, all.
func podFastPath(t *testing.T, tmpl kubealloc.Template) fastpath.Switches {
	t.Helper()
	pod := kubealloc.BuildPod(kubealloc.PodSpec{ID: "fbx-1", Namespace: "ns", TemplateName: "default", Template: tmpl})
	got := fastpath.All()
	for _, arg := range pod.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(arg, "-fast-path="); ok {
			var err error
			if got, err = fastpath.Parse(v); err != nil {
				t.Fatalf("the pod's %s: %v", arg, err)
			}
		}
	}
	return got
}

func TestKubePodsFollowTheManagersFastPath(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want fastpath.Switches
	}{
		{"all", fastpath.Switches{}},
		{"none", fastpath.Switches{}},
		{"keep-awake", fastpath.Switches{}},
	} {
		fast, err := fastpath.Parse(tc.flag)
		if err != nil {
			t.Fatal(err)
		}
		got := podFastPath(t, withFastPath(kubealloc.DefaultTemplate("img"), &fast))
		if got != tc.want {
			t.Errorf("--fast-path %s: the pod's server runs %v, want %v", tc.flag, got, tc.want)
		}
	}
	// No switches given: the pod keeps the server's default.
	if got := podFastPath(t, withFastPath(kubealloc.DefaultTemplate("img"), nil)); got != fastpath.All() {
		t.Errorf("no --fast-path: the pod's server runs %v, want all", got)
	}
	// A template's own -fast-path wins over the manager's.
	tmpl := kubealloc.DefaultTemplate("img")
	tmpl.ServerArgs = []string{"-fast-path=keep-awake"}
	none := fastpath.Switches{}
	if got := podFastPath(t, withFastPath(tmpl, &none)); got != (fastpath.Switches{KeepAwake: true}) {
		t.Errorf("template -fast-path=keep-awake under --fast-path none: the pod's server runs %v, want keep-awake", got)
	}
}
