package runscalloc

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/templates"
)

// warmUpTimeout is the sandbox server's bound on a template's warm-up commands
// (server.DefaultWarmUpTimeout; TestFromSpec checks they agree).
const warmUpTimeout = 5 * time.Minute

// FromSpec returns the template spec declares (a valid templates.Spec): its image, user, env
// (the commands' base environment, over the image's), working directory and warm-up commands
// (the server runs them before the sandbox joins the pool), and its limits, where a limit spec leaves out takes base's value
// (fusebox local up's --sandbox-* flags). The image is unpacked by NewContext.
func FromSpec(spec templates.Spec, base Limits) (Template, error) {
	l := base
	for _, q := range []struct {
		value string
		set   func(float64)
	}{
		{spec.Limits.CPU, func(v float64) { l.CPUs = v }},
		{spec.Limits.CPUQuota, func(v float64) { l.CPUQuota = v }},
		{spec.Limits.Memory, func(v float64) { l.MemoryBytes = int64(v) }},
		{spec.Limits.Workspace, func(v float64) { l.WorkspaceBytes = int64(v) }},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil {
			return Template{}, fmt.Errorf("template %s: %w", spec.Name, err)
		}
		q.set(v.AsApproximateFloat64())
	}
	if spec.Limits.Pids != 0 {
		l.Processes = spec.Limits.Pids
	}
	t, err := l.Template()
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	t.Image, t.User = spec.Image, spec.User
	t.ServerArgs = append(t.ServerArgs, spec.Limits.ServerArgs()...)
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		t.ServerArgs = append(t.ServerArgs, "-env="+k+"="+spec.Env[k])
	}
	if spec.Cwd != "" {
		t.ServerArgs = append(t.ServerArgs, "-cwd="+spec.Cwd)
	}
	if len(spec.WarmUp) > 0 {
		b, err := json.Marshal(spec.WarmUp)
		if err != nil {
			return Template{}, fmt.Errorf("template %s: %w", spec.Name, err)
		}
		t.ServerArgs = append(t.ServerArgs, "-warmup="+string(b))
		// The server runs them before its init socket appears.
		t.ReadyTimeout = localsandbox.DefaultReadyTimeout + warmUpTimeout
	}
	return t, nil
}
