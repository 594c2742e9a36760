// Command userlands builds the Debian userlands the tests and the release images use into the
// cache, when they are not there yet: the release images' (the sandbox and the gVisor
// installer, keyed as fusebox image build keys them) and the integration tests' small sandbox
// root (test/imagetest). make test runs it beside the toolchains' builds: mmdebstrap waits
// mostly on package downloads and unpacking while the compilers use the CPUs.
//
// Usage: go run ./hack/userlands [-cache DIR]
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/test/imagetest"
)

func main() {
	cache := flag.String("cache", imagetest.CacheDir(), "the cache directory ($FUSEBOX_CACHE)")
	flag.Parse()
	start := time.Now()
	if err := image.Userlands(image.BuildOptions{CacheDir: *cache, Progress: os.Stdout}); err != nil {
		fmt.Fprintln(os.Stderr, "userlands:", err)
		os.Exit(1)
	}
	if _, err := imagetest.RootfsTar(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "userlands: the tests' sandbox root:", err)
		os.Exit(1)
	}
	fmt.Printf("userlands: cached in %s (%s)\n", *cache, time.Since(start).Round(time.Second))
}
