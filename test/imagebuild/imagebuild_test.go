// Package imagebuild tests the images `fusebox image build --tar` makes, with the real tools
// that consume them: each image's archive imported into a real containerd with ctr (name and
// digest as the build printed them), and the gVisor node installer image unpacked and its
// entrypoint run from its own userland.
package imagebuild

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/test/imagetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	imagetest.Cleanup()
	os.Exit(code)
}

// goarch is the platform's architecture as OCI names it.
const goarch = runtime.GOARCH

// The release images and the tools' paths, as test/imagetest gives them.
var (
	buildImages = imagetest.Release
	runscPath   = imagetest.RunscPath
	shimPath    = imagetest.ShimPath
	cacheDir    = imagetest.CacheDir
)

func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// waitForLine reads r line by line until a line contains want, and returns every line read.
func waitForLine(sc *bufio.Scanner, want string) (string, bool) {
	var b strings.Builder
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), want) {
			return b.String(), true
		}
	}
	return b.String(), false
}
