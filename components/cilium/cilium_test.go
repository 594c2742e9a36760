package cilium

import (
	"errors"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const releaseType = "kubernetes:helm.sh/v3:Release"

func run(t *testing.T, a *CiliumArgs) *mocktest.Mocks {
	t.Helper()
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := NewCilium(ctx, "fb", a)
		return err
	})
	m.One(t, Type)
	m.AssertParented(t, Type)
	return m
}

func TestExistingCiliumInstallsNothing(t *testing.T) {
	m := run(t, &CiliumArgs{})
	if n := len(m.All()); n != 1 {
		t.Fatalf("existing Cilium: %d resources, want only the component", n)
	}
}

func TestInstallFromRepository(t *testing.T) {
	m := run(t, &CiliumArgs{Install: true, Chart: ChartSource{Repo: "https://helm.cilium.io", Version: "1.18.4"}})
	p := m.One(t, releaseType).Props()
	if mocktest.Str(p, "chart") != "cilium" || mocktest.Str(p, "version") != "1.18.4" ||
		mocktest.Str(p, "repositoryOpts", "repo") != "https://helm.cilium.io" || mocktest.Str(p, "namespace") != "kube-system" {
		t.Errorf("release %v", p)
	}
	if mocktest.Dig(p, "values", "socketLB", "hostNamespaceOnly") != true {
		t.Errorf("values %v", mocktest.Dig(p, "values"))
	}
	if mocktest.Dig(p, "values", "image") != nil {
		t.Errorf("image overridden without images: %v", mocktest.Dig(p, "values"))
	}
}

func TestInstallFromLocalPathWithMirroredImages(t *testing.T) {
	ref := func(n string) string { return "mirror.internal/cilium/" + n + "@sha256:" + strings.Repeat("a", 64) }
	m := run(t, &CiliumArgs{Install: true, Chart: ChartSource{Path: "/mirror/charts/cilium-1.18.4.tgz"},
		Images: Images{Agent: ref("cilium"), Operator: ref("operator-generic"), Envoy: ref("cilium-envoy")}})
	p := m.One(t, releaseType).Props()
	if mocktest.Str(p, "chart") != "/mirror/charts/cilium-1.18.4.tgz" || mocktest.Dig(p, "repositoryOpts") != nil {
		t.Errorf("release %v", p)
	}
	for path, want := range map[string]string{"image": ref("cilium"), "operator.image": ref("operator-generic"), "envoy.image": ref("cilium-envoy")} {
		var keys []any
		for _, k := range strings.Split(path, ".") {
			keys = append(keys, k)
		}
		if got := mocktest.Str(p["values"], append(keys, "override")...); got != want {
			t.Errorf("values.%s.override = %q, want %q", path, got, want)
		}
		if mocktest.Dig(p["values"], append(keys, "useDigest")...) != true {
			t.Errorf("values.%s.useDigest not set", path)
		}
	}
}

func TestRefused(t *testing.T) {
	for name, tc := range map[string]struct {
		args CiliumArgs
		want string
	}{
		"unpinned chart":    {CiliumArgs{Install: true, Chart: ChartSource{Repo: "https://helm.cilium.io"}}, "pinned version"},
		"image by tag":      {CiliumArgs{Install: true, Chart: ChartSource{Path: "/c"}, Images: Images{Agent: "mirror.internal/cilium:v1.18"}}, "images.agent"},
		"image, no install": {CiliumArgs{Images: Images{Envoy: "mirror.internal/envoy@sha256:" + strings.Repeat("b", 64)}}, "install is off"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewCilium(ctx, "fb", &tc.args)
				return err
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error naming %q, got %v", tc.want, err)
			}
			if name == "unpinned chart" && !errors.Is(err, ErrNoChart) {
				t.Errorf("not ErrNoChart: %v", err)
			}
		})
	}
}

// TestReleaseWaitsLongEnough: Helm waits for Cilium's agents on every node for
// ReleaseTimeoutSeconds, not its default 300 s (a Helm release takes no customTimeouts).
func TestReleaseWaitsLongEnough(t *testing.T) {
	m := run(t, &CiliumArgs{Install: true, Chart: ChartSource{Path: "./cilium"}})
	if got := mocktest.Dig(m.One(t, releaseType).Props(), "timeout"); got != float64(ReleaseTimeoutSeconds) || ReleaseTimeoutSeconds < 600 {
		t.Errorf("release timeout %v, want %d (at least 600)", got, ReleaseTimeoutSeconds)
	}
}
