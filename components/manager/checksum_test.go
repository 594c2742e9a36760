package manager

import (
	"maps"
	"slices"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// podAnnotations runs NewManager with a and returns its Deployment's pod template annotations
// and the data of each ConfigMap it registered, by name.
func podAnnotations(t *testing.T, a *ManagerArgs) (map[string]string, map[string]map[string]string) {
	t.Helper()
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := NewManager(ctx, "fb", a)
		return err
	})
	ann := map[string]string{}
	raw, _ := mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "metadata", "annotations").(map[string]any)
	for k, v := range raw {
		ann[k], _ = v.(string)
	}
	data := map[string]map[string]string{}
	for _, r := range m.ByType("kubernetes:core/v1:ConfigMap") {
		d := map[string]string{}
		raw, _ := mocktest.Dig(r.Props(), "data").(map[string]any)
		for k, v := range raw {
			d[k], _ = v.(string)
		}
		data[mocktest.Str(r.Props(), "metadata", "name")] = d
	}
	return ann, data
}

// TestConfigChecksumsRollTheManager: the manager reads its ConfigMaps once, at start, so its
// pod template carries a checksum of each; a change to one ConfigMap changes its checksum (the
// Deployment rolls), and a change elsewhere, or none, leaves both as they were.
func TestConfigChecksumsRollTheManager(t *testing.T) {
	base, data := podAnnotations(t, args())
	read := []string{TemplateCMName, PolicyCMName}
	if len(base) != len(read) {
		t.Fatalf("pod template annotations %v, want one checksum per ConfigMap the manager reads %v", base, read)
	}
	for _, cm := range read {
		if data[cm] == nil {
			t.Fatalf("ConfigMap %s not registered", cm)
		}
		if got, want := base[ChecksumAnnotation(cm)], DataChecksum(data[cm]); got != want || len(got) != 64 {
			t.Errorf("%s = %q, want the SHA-256 of the ConfigMap's data %q", ChecksumAnnotation(cm), got, want)
		}
	}
	for _, tc := range []struct {
		name    string
		edit    func(*ManagerArgs)
		changed []string // the checksums that change
	}{
		{"unchanged", func(*ManagerArgs) {}, nil},
		{"pool size (a flag, not a ConfigMap)", func(a *ManagerArgs) { a.PoolSize, a.PoolMax = 3, 5 }, nil},
		{"access", func(a *ManagerArgs) { a.Access = []AccessRule{{Namespaces: []string{"agents"}}} }, []string{PolicyCMName}},
		{"operators", func(a *ManagerArgs) { a.Operators = []string{"ops/auditor"} }, []string{PolicyCMName}},
		{"sandbox cpu", func(a *ManagerArgs) { a.Sandbox.CPU = "2" }, []string{TemplateCMName}},
		{"sandbox memory", func(a *ManagerArgs) { a.Sandbox.Memory = "4Gi" }, []string{TemplateCMName}},
		{"sandbox placement", func(a *ManagerArgs) { p := GKESandboxPlacement(); a.Sandbox.Placement = &p }, []string{TemplateCMName}},
		{"sandbox image", func(a *ManagerArgs) {
			a.Sandbox.Image = "registry.example.com/fusebox/sandbox@sha256:" + "1d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
		}, []string{TemplateCMName}},
		{"both", func(a *ManagerArgs) {
			a.Sandbox.CPU = "2"
			a.Access = []AccessRule{{Namespaces: []string{"agents"}}}
		}, []string{TemplateCMName, PolicyCMName}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := args()
			tc.edit(a)
			got, _ := podAnnotations(t, a)
			if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(base))) {
				t.Fatalf("annotations %v, want the keys of %v", got, base)
			}
			for _, cm := range read {
				k := ChecksumAnnotation(cm)
				want := slices.Contains(tc.changed, cm)
				if (got[k] != base[k]) != want {
					t.Errorf("%s: %q, was %q; want changed=%t", k, got[k], base[k], want)
				}
			}
		})
	}
}

func TestDataChecksum(t *testing.T) {
	// Length-prefixed: moving bytes between a key and its value, or between entries, changes
	// the checksum.
	pairs := []map[string]string{
		{"a": "bc"}, {"ab": "c"}, {"a": "b", "c": ""}, {"a": "", "bc": ""}, {},
	}
	seen := map[string]int{}
	for i, d := range pairs {
		s := DataChecksum(d)
		if j, dup := seen[s]; dup {
			t.Errorf("%v and %v hash alike", pairs[j], d)
		}
		seen[s] = i
		if DataChecksum(maps.Clone(d)) != s {
			t.Errorf("%v: not stable", d)
		}
	}
}
