package image

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/test/testenv"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// BenchmarkImageBuild builds all three images with the full package sets, cold (an empty
// userland cache: mmdebstrap runs) and then warm (the cached userlands), and reports both
// times and each image's size. Each iteration starts from an empty cache. It writes the
// layouts to $FUSEBOX_BENCH_OUT when set (for BenchmarkPush in test/registry).
//
//	go test -run '^$' -bench ImageBuild -benchtime 1x ./internal/image/
func BenchmarkImageBuild(b *testing.B) {
	needMmdebstrap(b)
	cache := filepath.Join(envOr("FUSEBOX_CACHE", "/var/cache/fusebox"), "")
	o := BuildOptions{
		ModuleDir: testenv.ModuleRoot(), ManagerPackage: managerPackage(b),
		Runsc: envOr("FUSEBOX_RUNSC", filepath.Join(cache, "runsc-v0.0.0-20260905035102-160fafc42237", "runsc")),
		Shim:  envOr("FUSEBOX_SHIM", filepath.Join(cache, "shim-v0.0.0-20260905035102-160fafc42237", "containerd-shim-runsc-v1")),
	}
	for _, p := range []string{o.Runsc, o.Shim} {
		if _, err := os.Stat(p); err != nil {
			b.Skipf("%s missing: make runsc shim", p)
		}
	}
	var cold, warm time.Duration
	var built []Built
	for i := 0; i < b.N; i++ {
		o.CacheDir, o.Out = b.TempDir(), envOr("FUSEBOX_BENCH_OUT", b.TempDir())
		start := time.Now()
		if _, err := Build(o); err != nil {
			b.Fatal(err)
		}
		cold += time.Since(start)
		start = time.Now()
		var err error
		if built, err = Build(o); err != nil {
			b.Fatal(err)
		}
		warm += time.Since(start)
	}
	b.ReportMetric(cold.Seconds()/float64(b.N), "cold-s")
	b.ReportMetric(warm.Seconds()/float64(b.N), "warm-s")
	for _, x := range built {
		b.ReportMetric(float64(x.Size)/(1<<20), x.Name+"-MiB")
		b.Logf("%s %s %.1f MiB", x.Name, x.Digest, float64(x.Size)/(1<<20))
	}
	b.ReportMetric(0, "ns/op")
}
