package managere2e

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// wheel returns a pure-Python wheel of package name at version whose module holds body:
// what pip installs from an index, with a RECORD of the files' hashes.
func wheel(t *testing.T, name, version, body string) []byte {
	t.Helper()
	info := name + "-" + version + ".dist-info/"
	files := [][2]string{
		{name + "/__init__.py", body},
		{info + "METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: fusebox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	record.WriteString(info + "RECORD,,\n")
	files = append(files, [2]string{info + "RECORD", record.String()})
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: f[0], Method: zip.Deflate, Modified: time.Unix(1767225600, 0).UTC()})
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f[1]))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// pipIndex is a PEP 503 simple index on loopback serving one wheel, counting the downloads.
type pipIndex struct {
	addr      string
	downloads atomic.Int64
}

func startPipIndex(t *testing.T, name string, whl []byte, file string) *pipIndex {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	x := &pipIndex{addr: ln.Addr().String()}
	sum := sha256.Sum256(whl)
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/"+name+"/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/files/%s#sha256=%s\">%s</a></body></html>\n", file, hex.EncodeToString(sum[:]), file)
	})
	mux.HandleFunc("/files/"+file, func(w http.ResponseWriter, r *http.Request) {
		x.downloads.Add(1)
		w.Write(whl)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return x
}

// pipDockerfile installs fbxdemo with pip from the index at %[2]s (the only destination the
// build may reach) into the sandbox image %[1]s, with COPY, ENV and WORKDIR around it.
const pipDockerfile = `FROM %[1]s
USER 0:0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 APP_GREETING=from-env
WORKDIR /opt/app
COPY app.py ./
RUN python3 -m pip install --quiet --no-compile --break-system-packages --index-url http://%[2]s/simple/ fbxdemo==1.0
USER 65532:65532
`

// TestTemplateBuildPipInstall: a Dockerfile whose RUN step installs a package with pip from
// an index the test serves on loopback, named by the build's egress allowlist, builds twice
// (the second time with nothing cached) to the same digest; the built image is then a
// template of `fusebox local up`, and `fusebox run --template` runs the script COPY put in
// the WORKDIR, which imports the package and reads the ENV.
func TestTemplateBuildPipInstall(t *testing.T) {
	sandboxImage := imagetest.Release(t)["sandbox"]
	e := newEnv(t)
	ctx := testenv.Context(t, 15*time.Minute)
	idx := startPipIndex(t, "fbxdemo", wheel(t, "fbxdemo", "1.0", "def greet():\n    return 'hello from fbxdemo'\n"),
		"fbxdemo-1.0-py3-none-any.whl")
	dir := t.TempDir()
	buildCtx := filepath.Join(dir, "context")
	os.MkdirAll(buildCtx, 0o755)
	os.WriteFile(filepath.Join(buildCtx, "app.py"), []byte("import os, fbxdemo\nprint(fbxdemo.greet(), os.environ['APP_GREETING'], os.path.dirname(__file__))\n"), 0o644)
	df := filepath.Join(dir, "Dockerfile")
	os.WriteFile(df, []byte(fmt.Sprintf(pipDockerfile, sandboxImage.Dir+"@"+sandboxImage.Digest, idx.addr)), 0o644)

	digestLine := regexp.MustCompile(`@(sha256:[0-9a-f]{64})\s*$`)
	buildOnce := func(name string) string {
		out := filepath.Join(dir, name)
		code, stdout, stderr := runFusebox(t, ctx, "template", "build", "-f", df, "--tag", "pipdemo", "--out", out,
			"--egress", idx.addr, "--cache", filepath.Join(dir, name+"-cache"), "--runsc", e.Runsc, "--sandbox-binary", e.Sandbox, buildCtx)
		m := digestLine.FindStringSubmatch(stdout)
		if code != 0 || m == nil {
			t.Fatalf("fusebox template build (%s): exit %d\nstdout: %s\nstderr: %s", name, code, stdout, stderr)
		}
		return out + "@" + m[1]
	}
	first := buildOnce("first")
	second := buildOnce("second")
	if d1, d2 := first[strings.LastIndex(first, "@"):], second[strings.LastIndex(second, "@"):]; d1 != d2 {
		t.Errorf("two uncached builds of the same inputs: %s and %s", d1, d2)
	}
	if n := idx.downloads.Load(); n != 2 {
		t.Errorf("the index served the wheel %d times, want once per build", n)
	}
	bom, err := os.ReadFile(filepath.Join(dir, "first", "sbom.spdx.json"))
	if err != nil || !bytes.Contains(bom, []byte(`"pkg:pypi/fbxdemo@1.0"`)) || !bytes.Contains(bom, []byte(`"pkg:deb/debian/python3-pip@`)) {
		t.Errorf("the SBOM (%v) does not list the installed fbxdemo 1.0 and the base's python3-pip:\n%.2000s", err, bom)
	}

	file := filepath.Join(dir, "templates.yaml")
	os.WriteFile(file, []byte("templates:\n- name: pipdemo\n  image: "+first+"\n  pool: {min: 1}\n"), 0o644)
	m := e.startLocalUp(t, "manager", "--templates", file, "--pool-size", "0")
	mc := dialManager(t, e.Addr)
	e.waitServing(t, m, mc)
	code, out, errOut := runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "pipdemo", "--", "python3", "/opt/app/app.py")
	if want := "hello from fbxdemo from-env /opt/app\n"; code != 0 || out != want {
		t.Errorf("fusebox run --template pipdemo: exit %d\nstdout: %q\nwant:   %q\nstderr: %s", code, out, want, errOut)
	}
	if code := m.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("manager exit code %d after SIGTERM", code)
	}
}
