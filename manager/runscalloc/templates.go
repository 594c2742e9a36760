package runscalloc

import (
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fusebox-dev/fusebox/internal/templates"
)

// FromSpec returns the template spec declares (a valid templates.Spec): its image, user, env
// (the commands' base environment, over the image's) and working directory, and its limits, where a limit spec leaves out takes base's value
// (fusebox local up's --sandbox-* flags). The image is unpacked by NewContext.
func FromSpec(spec templates.Spec, base Limits) (Template, error) {
	if len(spec.WarmUp) > 0 {
		return Template{}, fmt.Errorf("template %s: warmUp is not supported by the runsc allocator", spec.Name)
	}
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
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		t.ServerArgs = append(t.ServerArgs, "-env="+k+"="+spec.Env[k])
	}
	if spec.Cwd != "" {
		t.ServerArgs = append(t.ServerArgs, "-cwd="+spec.Cwd)
	}
	return t, nil
}
