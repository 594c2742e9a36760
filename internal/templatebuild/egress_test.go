package templatebuild_test

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/templatebuild"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

var (
	sandboxOnce sync.Once
	sandboxPath string
	sandboxErr  error
)

// sandboxBinary builds the static fusebox-sandbox once per test binary (as test/sandboxtest
// does, without that package's client and sandbox dependencies) and returns its path.
func sandboxBinary(t *testing.T) string {
	t.Helper()
	sandboxOnce.Do(func() {
		dir, err := os.MkdirTemp("", "templatebuild-sandbox-")
		if err != nil {
			sandboxErr = err
			return
		}
		sandboxPath = filepath.Join(dir, "fusebox-sandbox")
		cmd := exec.Command("go", "build", "-trimpath", "-o", sandboxPath, "./cmd/fusebox-sandbox")
		cmd.Dir = testenv.ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			sandboxErr = fmt.Errorf("%w\n%s", err, out)
		}
	})
	if sandboxErr != nil {
		t.Fatalf("building fusebox-sandbox: %v", sandboxErr)
	}
	return sandboxPath
}

// fetchScript fetches URL into FILE with Perl's HTTP::Tiny, which takes the proxy from
// http_proxy as clients do (the test image has neither pip nor curl, and its minimal Python
// lacks http.client; git brings Perl). A failure prints the status and the body and exits 1.
const fetchScript = `use strict;
use HTTP::Tiny;
my ($url, $file) = @ARGV;
my $r = HTTP::Tiny->new(timeout => 60)->get($url);
print "status $r->{status}\n";
if (!$r->{success}) { print $r->{content}; exit 1; }
open(my $f, '>', $file) or die "$file: $!";
print $f $r->{content};
close $f;
`

// packageServer serves /pkg.txt on loopback and counts the connections it accepts.
type packageServer struct {
	addr  string // 127.0.0.1:PORT
	conns atomic.Int64
}

const packageContent = "a package from the build's allowlisted server\n"

func startPackageServer(t *testing.T) *packageServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &packageServer{addr: ln.Addr().String()}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/pkg.txt" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprint(w, packageContent)
		}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A RUN step of a build with an egress allowlist reaches the allowlisted server through the
// proxy, and nothing else: not the server directly, not the socket's directory, and the
// relay's mounts are not in its layer.
func TestEgress(t *testing.T) {
	base := baseImage(t)
	sandbox := sandboxBinary(t)
	srv := startPackageServer(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{"fetch.pl": fetchScript})
	_, port, _ := net.SplitHostPort(srv.addr)
	df := fmt.Sprintf(`FROM %s
COPY fetch.pl /fetch.pl
RUN perl /fetch.pl http://%s/pkg.txt /fetched.txt
RUN (python3 -c "import socket; socket.create_connection(('127.0.0.1', %s), 5)" && echo bypassed || echo confined) > /direct; \
    (echo x > /dev/fusebox/egress/x && echo wrote || echo refused) > /egress-dir; \
    env | grep -i '_proxy=' | sort > /proxy-env
`, base, srv.addr, port)
	cache := t.TempDir()
	o := options(t, ctxDir, df, cache)
	o.Egress = []string{srv.addr}
	o.SandboxBinary = sandbox
	res, err := build(t, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if res.Ran != 2 || !slices.Equal(res.Egress, []string{srv.addr}) {
		t.Errorf("result = %+v, want 2 RUN steps run with egress %s", res, srv.addr)
	}
	if n := srv.conns.Load(); n != 1 {
		t.Errorf("the server accepted %d connections, want 1 (the proxy's)", n)
	}
	r := unpack(t, res)
	for file, want := range map[string]string{
		"fetched.txt": packageContent,
		"direct":      "confined\n",
		"egress-dir":  "refused\n",
		"proxy-env": "HTTPS_PROXY=http://127.0.0.1:3128\nHTTP_PROXY=http://127.0.0.1:3128\nNO_PROXY=localhost,::1\n" +
			"http_proxy=http://127.0.0.1:3128\nhttps_proxy=http://127.0.0.1:3128\nno_proxy=localhost,::1\n",
	} {
		if data, err := os.ReadFile(filepath.Join(r.Dir, file)); err != nil || string(data) != want {
			t.Errorf("the image's /%s = %q, %v; want %q", file, data, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(r.Dir, "dev", "fusebox")); err == nil {
		t.Error("the relay's mount points are in the image")
	}
	if slices.ContainsFunc(r.Config.Env, func(kv string) bool { return strings.Contains(strings.ToLower(kv), "_proxy=") }) {
		t.Errorf("the image's Env %q holds the steps' proxy variables", r.Config.Env)
	}

	t.Run("record", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(o.Out, templatebuild.RecordFile))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Dockerfile string
			Egress     []string
			Steps      []struct{ Layer string }
		}
		if err := json.Unmarshal(data, &rec); err != nil {
			t.Fatal(err)
		}
		f, _ := dockerfile.ParseBytes([]byte(df))
		if rec.Dockerfile != f.Digest() || !slices.Equal(rec.Egress, []string{srv.addr}) {
			t.Errorf("record = %s, want the Dockerfile's digest %s and egress [%s]", data, f.Digest(), srv.addr)
		}
		img, err := layout.Path(o.Out).Image(res.Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Annotations[templatebuild.AnnotationEgress]; got != srv.addr {
			t.Errorf("annotation %s = %q, want %q", templatebuild.AnnotationEgress, got, srv.addr)
		}
		// The steps' layers hold what the steps wrote, and nothing of the relay's mounts.
		for _, st := range rec.Steps {
			if st.Layer == "" {
				continue
			}
			h, err := v1.NewHash(st.Layer)
			if err != nil {
				t.Fatal(err)
			}
			l, err := img.LayerByDigest(h)
			if err != nil {
				t.Fatal(err)
			}
			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(rc)
			for {
				hdr, err := tr.Next()
				if err != nil {
					break
				}
				if strings.HasPrefix(strings.TrimPrefix(hdr.Name, "./"), "dev") {
					t.Errorf("layer %s holds %s", h, hdr.Name)
				}
			}
			rc.Close()
		}
	})

	t.Run("same allowlist, same digest", func(t *testing.T) {
		o2 := o
		o2.Out = filepath.Join(t.TempDir(), "out")
		o2.CacheDir = t.TempDir() // nothing cached
		res2, err := build(t, o2)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if res2.Ran != 2 || res2.Digest != res.Digest {
			t.Errorf("uncached rebuild = %+v, want 2 RUN steps run and digest %s", res2, res.Digest)
		}
	})
	t.Run("the same entries in another order are cached", func(t *testing.T) {
		o3 := o
		o3.Out = filepath.Join(t.TempDir(), "out")
		o3.Egress = []string{"example.com:443", srv.addr, "example.com:443"}
		o4 := o3
		o4.Egress = []string{srv.addr, "EXAMPLE.com.:443"}
		res3, err := build(t, o3)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if res3.Ran != 2 || res3.Digest == res.Digest {
			t.Errorf("a changed allowlist: %+v, want both RUN steps run again and another digest than %s", res3, res.Digest)
		}
		o4.Out = filepath.Join(t.TempDir(), "out")
		res4, err := build(t, o4)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if res4.Ran != 0 || res4.Digest != res3.Digest {
			t.Errorf("the same allowlist reordered: %+v, want nothing run and digest %s", res4, res3.Digest)
		}
	})

	t.Run("a destination not on the allowlist", func(t *testing.T) {
		other := closedPort(t)
		df := fmt.Sprintf("FROM %s\nCOPY fetch.pl /fetch.pl\nRUN perl /fetch.pl http://%s/pkg.txt /fetched.txt\n", base, other)
		o := options(t, ctxDir, df, cache)
		o.Egress = []string{srv.addr}
		o.SandboxBinary = sandbox
		_, err := build(t, o)
		var se *templatebuild.StepError
		if !errors.As(err, &se) || se.Line != 3 || !strings.Contains(se.Output, "status 403") ||
			!strings.Contains(se.Output, "fusebox egress: "+other+" is not on this sandbox's egress allowlist") {
			t.Errorf("Build = %v; want the step failed with the proxy's 403", err)
		}
	})
}
