package daemon

import (
	"flag"
	"io"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
)

// podFastPath is the -fast-path a sandbox pod's server parses from BuildPod's arguments, the
// way fusebox-sandbox does (the flag package keeps the last value).
func podFastPath(t *testing.T, tmpl kubealloc.Template) fastpath.Switches {
	t.Helper()
	pod := kubealloc.BuildPod(kubealloc.PodSpec{ID: "fbx-1", Namespace: "ns", TemplateName: "default", Template: tmpl})
	fs := flag.NewFlagSet("fusebox-sandbox", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	got := fastpath.All()
	fs.Var(&got, "fast-path", "")
	for _, name := range []string{"init-listen", "data-listen", "workspace", "idle-ttl"} {
		fs.String(name, "", "")
	}
	if err := fs.Parse(pod.Spec.Containers[0].Args); err != nil {
		t.Fatalf("parsing %q: %v", pod.Spec.Containers[0].Args, err)
	}
	return got
}

func TestKubePodsFollowTheManagersFastPath(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want fastpath.Switches
	}{
		{"all", fastpath.Switches{Relay: true, PoolProcs: true}},
		{"none", fastpath.Switches{}},
		{"relay,handoff,keep-awake", fastpath.Switches{Relay: true}},
		{"pool-procs", fastpath.Switches{PoolProcs: true}},
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
	tmpl.ServerArgs = []string{"-fast-path=none"}
	all := fastpath.All()
	if got := podFastPath(t, withFastPath(tmpl, &all)); got != (fastpath.Switches{}) {
		t.Errorf("template -fast-path=none under --fast-path all: the pod's server runs %v, want none", got)
	}
}
