package runscalloc

import (
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/sandbox-server/server"
)

// TestFromSpec: a template's limits replace the base's field by field, its env becomes the
// server's -env flags in key order, and what the runsc allocator cannot do is refused.
func TestFromSpec(t *testing.T) {
	spec := templates.Spec{Name: "py", Image: "/layouts/py@sha256:" + strings.Repeat("a", 64), User: "nobody",
		Limits: templates.Limits{CPU: "500m", Memory: "768Mi", Pids: 128, Processes: 3, ProcessBuffer: "64Ki"},
		Env:    map[string]string{"B": "2", "A": "1"}, Cwd: "/srv"}
	tm, err := FromSpec(spec, Limits{WorkspaceBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b := tm.Bundle
	if b.CPUShares != 512 || b.MemoryLimitBytes != 768<<20 || b.ProcessLimit != 128 || b.WorkspaceSizeBytes != 256<<20 || b.CPUQuota != 0 {
		t.Errorf("bundle limits %+v", b)
	}
	if !slices.Equal(tm.ServerArgs, []string{"-max-processes=3", "-process-buffer-bytes=65536", "-env=A=1", "-env=B=2", "-cwd=/srv"}) || tm.Image != spec.Image || tm.User != "nobody" {
		t.Errorf("template %+v", tm)
	}
	if tm.ReadyTimeout != 0 {
		t.Errorf("a template without warm-up has its own ready timeout %v", tm.ReadyTimeout)
	}
	spec.WarmUp = []templates.Command{{Argv: []string{"python3", "-c", "import json"}}, {Script: "echo ok"}}
	warm, err := FromSpec(spec, Limits{WorkspaceBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := warm.ServerArgs[len(warm.ServerArgs)-1]; got != `-warmup=[{"argv":["python3","-c","import json"]},{"script":"echo ok"}]` {
		t.Errorf("warm-up flag %s", got)
	}
	if warmUpTimeout != server.DefaultWarmUpTimeout || warm.ReadyTimeout != localsandbox.DefaultReadyTimeout+server.DefaultWarmUpTimeout {
		t.Errorf("ready timeout %v, the server's warm-up bound %v", warm.ReadyTimeout, server.DefaultWarmUpTimeout)
	}
	spec.WarmUp = nil
	for name, change := range map[string]func(*templates.Spec){
		"memory": func(s *templates.Spec) { s.Limits.Memory = "128Mi" }, // the base's workspace does not fit
	} {
		s := spec
		change(&s)
		if _, err := FromSpec(s, Limits{WorkspaceBytes: 256 << 20}); err == nil || !strings.Contains(err.Error(), "template py") {
			t.Errorf("%s: %v, want an error naming the template", name, err)
		}
	}
}
