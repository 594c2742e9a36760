package templatebuild_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/rootfs"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/templatebuild"
	"github.com/fusebox-dev/fusebox/test/imagetest"
)

// The base image: the test userland (Debian 12 with python3) as root, in /workspace.
var (
	baseOnce   sync.Once
	baseDir    string
	baseDigest v1.Hash
	baseErr    error
)

// baseImage returns the base image's layout as DIR@sha256:..., written once per test binary.
func baseImage(t *testing.T) string {
	t.Helper()
	baseOnce.Do(func() {
		img, err := imagetest.PlainImage(v1.Config{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
			WorkingDir: "/workspace",
		}, io.Discard)
		if err != nil {
			baseErr = err
			return
		}
		if baseDir, baseErr = os.MkdirTemp("", "templatebuild-base-"); baseErr != nil {
			return
		}
		baseDir = filepath.Join(baseDir, "layout")
		baseDigest, baseErr = imagetest.WriteImage(baseDir, img)
	})
	if baseErr != nil {
		t.Fatalf("making the base image: %v", baseErr)
	}
	return baseDir + "@" + baseDigest.String()
}

// sharedCache is the cache directory of the builds that do not test the cache itself, and of
// the unpacking of their results: the base image is unpacked once, not once per test.
var sharedCache string

func TestMain(m *testing.M) {
	var err error
	if sharedCache, err = os.MkdirTemp("", "templatebuild-cache-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if baseDir != "" {
		os.RemoveAll(filepath.Dir(baseDir))
	}
	if sandboxPath != "" {
		os.RemoveAll(filepath.Dir(sandboxPath))
	}
	os.RemoveAll(sharedCache)
	os.Exit(code)
}

// writeFiles writes files (name: content; a name ending in * is made executable) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, "*") {
			name, mode = strings.TrimSuffix(name, "*"), 0o755
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
}

// options returns Options for a build of dockerfile in context ctx with the real runsc.
func options(t *testing.T, ctx, dockerfile, cache string) templatebuild.Options {
	return templatebuild.Options{
		DockerfileData: []byte(dockerfile),
		Context:        ctx,
		Tag:            "app",
		Out:            filepath.Join(t.TempDir(), "out"),
		CacheDir:       cache,
		Runsc:          runsctest.Binary(t),
		Progress:       testWriter{t},
	}
}

// testWriter logs the build's progress.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func build(t *testing.T, o templatebuild.Options) (*templatebuild.Result, error) {
	t.Helper()
	b, err := templatebuild.New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b.Build(t.Context())
}

// unpack unpacks the built image and returns its root and config.
func unpack(t *testing.T, res *templatebuild.Result) *rootfs.Root {
	t.Helper()
	src, err := rootfs.ParseSource(res.Reference)
	if err != nil {
		t.Fatal(err)
	}
	r, err := rootfs.Prepare(t.Context(), src, filepath.Join(sharedCache, "unpacked"), nil)
	if err != nil {
		t.Fatalf("unpacking %s: %v", res.Reference, err)
	}
	return r
}

func owner(t *testing.T, p string) (uint32, uint32, os.FileMode) {
	t.Helper()
	info, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := info.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, info.Mode()
}

const appDockerfile = `# syntax=docker/dockerfile:1
ARG GREETING=hello
FROM %s
ARG GREETING
ENV APP_HOME=/opt/app GREETING=${GREETING}
WORKDIR $APP_HOME
COPY --chown=nobody:nogroup pkg/ ./pkg/
COPY run.py *.txt ./
RUN python3 -c "import os; open('built.txt', 'w').write(os.environ['GREETING'] + ' ' + os.getcwd())"
RUN ["python3", "-c", "import pkg.mod, sys; print('imported', pkg.mod.VALUE); print('to stderr', file=sys.stderr)"]
USER nobody
RUN python3 -c "import os; open('/tmp/by-user', 'w').write(str(os.getuid()))"
LABEL org.example.team=ml version="1.0"
`

func appContext(t *testing.T) string {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"pkg/__init__.py": "",
		"pkg/mod.py":      "VALUE = 42\n",
		"run.py*":         "#!/usr/bin/env python3\nimport pkg.mod\nprint(pkg.mod.VALUE)\n",
		"notes.txt":       "notes\n",
		"unused":          "not copied\n",
	})
	return dir
}

func TestBuild(t *testing.T) {
	base := baseImage(t)
	ctxDir := appContext(t)
	df := fmt.Sprintf(appDockerfile, base)
	o := options(t, ctxDir, df, sharedCache)
	o.BuildArgs = map[string]string{"GREETING": "hi", "UNUSED": "x"}
	res, err := build(t, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if res.Ran != 3 || res.Cached != 0 || res.Steps != 9 || res.Reference != o.Out+"@"+res.Digest.String() {
		t.Errorf("result = %+v, want 3 RUN steps run, none cached, 9 steps, reference %s@digest", res, o.Out)
	}
	if res.BaseDigest.String() != strings.SplitN(base, "@", 2)[1] {
		t.Errorf("base digest = %s, want %s", res.BaseDigest, base)
	}

	r := unpack(t, res)
	t.Run("files", func(t *testing.T) {
		for _, c := range []struct {
			path     string
			content  string
			uid, gid uint32
			mode     os.FileMode
		}{
			{"opt/app/pkg/mod.py", "VALUE = 42\n", 65534, 65534, 0o644},
			{"opt/app/pkg/__init__.py", "", 65534, 65534, 0o644},
			{"opt/app/run.py", "#!/usr/bin/env python3\nimport pkg.mod\nprint(pkg.mod.VALUE)\n", 0, 0, 0o755},
			{"opt/app/notes.txt", "notes\n", 0, 0, 0o644},
			{"opt/app/built.txt", "hi /opt/app", 0, 0, 0o644},
			{"tmp/by-user", "65534", 65534, 65534, 0o644},
		} {
			p := filepath.Join(r.Dir, c.path)
			data, err := os.ReadFile(p)
			if err != nil || string(data) != c.content {
				t.Errorf("%s = %q, %v; want %q", c.path, data, err, c.content)
				continue
			}
			if uid, gid, mode := owner(t, p); uid != c.uid || gid != c.gid || mode.Perm() != c.mode {
				t.Errorf("%s: %d:%d %v, want %d:%d %v", c.path, uid, gid, mode, c.uid, c.gid, c.mode)
			}
		}
		if _, err := os.Stat(filepath.Join(r.Dir, "opt/app/unused")); err == nil {
			t.Error("a file no COPY names is in the image")
		}
		if uid, _, _ := owner(t, filepath.Join(r.Dir, "opt/app/pkg")); uid != 65534 {
			t.Errorf("opt/app/pkg belongs to %d, want nobody (--chown)", uid)
		}
	})
	t.Run("config", func(t *testing.T) {
		c := r.Config
		for _, want := range []string{"APP_HOME=/opt/app", "GREETING=hi", "LANG=C.UTF-8"} {
			if !slices.Contains(c.Env, want) {
				t.Errorf("Env = %q, want %s", c.Env, want)
			}
		}
		if slices.ContainsFunc(c.Env, func(kv string) bool { return strings.HasPrefix(kv, "UNUSED=") }) {
			t.Errorf("Env = %q holds a build argument", c.Env)
		}
		if c.WorkingDir != "/opt/app" || c.User != "nobody" || c.Labels["org.example.team"] != "ml" || c.Labels["version"] != "1.0" {
			t.Errorf("config = %+v", c)
		}
	})
	t.Run("layout and record", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(o.Out, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		var idx v1.IndexManifest
		if err := json.Unmarshal(data, &idx); err != nil || len(idx.Manifests) != 1 ||
			idx.Manifests[0].Digest != res.Digest || idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "app" {
			t.Errorf("index.json = %s, %v; want the image tagged app", data, err)
		}
		data, err = os.ReadFile(filepath.Join(o.Out, templatebuild.RecordFile))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Digest, Dockerfile string
			Base               struct{ Digest string }
			BuildArgs          map[string]string
			Steps              []struct{ Line int }
			SBOM               struct {
				File, SHA256 string
				Packages     int
			}
		}
		if err := json.Unmarshal(data, &rec); err != nil {
			t.Fatal(err)
		}
		f, _ := dockerfile.ParseBytes([]byte(df))
		if rec.Digest != res.Digest.String() || rec.Dockerfile != f.Digest() || rec.Base.Digest != res.BaseDigest.String() ||
			rec.BuildArgs["GREETING"] != "hi" || len(rec.Steps) != 9 || rec.Steps[0].Line != 5 {
			t.Errorf("record = %s", data)
		}
		bom, err := os.ReadFile(filepath.Join(o.Out, templatebuild.SBOMFile))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(bom)
		if rec.SBOM.File != templatebuild.SBOMFile || rec.SBOM.SHA256 != hex.EncodeToString(sum[:]) || rec.SBOM.Packages != res.Packages ||
			res.Packages < 10 || res.SBOM != filepath.Join(o.Out, templatebuild.SBOMFile) {
			t.Errorf("SBOM in the record %+v, result %s with %d packages", rec.SBOM, res.SBOM, res.Packages)
		}
		// The base image's Debian packages, named by its os-release.
		if !bytes.Contains(bom, []byte(`"pkg:deb/debian/python3-minimal@`)) || !bytes.Contains(bom, []byte("distro=debian-12")) {
			t.Errorf("the SBOM does not list python3-minimal from Debian 12:\n%.2000s", bom)
		}
	})

	t.Run("cached rebuild runs nothing", func(t *testing.T) {
		o2 := o
		o2.Out = filepath.Join(t.TempDir(), "out")
		res2, err := build(t, o2)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if res2.Ran != 0 || res2.Cached != 6 || res2.Digest != res.Digest {
			t.Errorf("rebuild = %+v, want no RUN run, 6 steps cached, digest %s", res2, res.Digest)
		}
	})
	t.Run("a changed step runs again after cached ones", func(t *testing.T) {
		o3 := o
		o3.Out = filepath.Join(t.TempDir(), "out")
		o3.DockerfileData = []byte(strings.Replace(df, "LABEL", "RUN python3 -c \"open('/tmp/more', 'w').write('x')\"\nLABEL", 1))
		res3, err := build(t, o3)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if res3.Ran != 1 || res3.Cached != 6 {
			t.Errorf("result = %+v, want 1 RUN run, 6 cached", res3)
		}
		if data, err := os.ReadFile(filepath.Join(unpack(t, res3).Dir, "tmp/more")); err != nil || string(data) != "x" {
			t.Errorf("tmp/more = %q, %v", data, err)
		}
	})
	t.Run("same inputs, same digest", func(t *testing.T) {
		o4 := o
		o4.Out = filepath.Join(t.TempDir(), "elsewhere", "out")
		o4.CacheDir = t.TempDir() // nothing cached
		res4, err := build(t, o4)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		if res4.Ran != 3 || res4.Digest != res.Digest {
			t.Errorf("uncached rebuild = %+v, want 3 RUN steps run and digest %s", res4, res.Digest)
		}
		a, _ := os.ReadFile(res.SBOM)
		b, _ := os.ReadFile(res4.SBOM)
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Error("the two builds' SBOMs differ")
		}
	})
}

func TestRunFails(t *testing.T) {
	base := baseImage(t)
	o := options(t, t.TempDir(), "FROM "+base+"\nRUN echo one\nRUN echo before-failing && echo on-stderr >&2 && exit 7\nRUN echo never\n", sharedCache)
	res, err := build(t, o)
	var se *templatebuild.StepError
	if !errors.As(err, &se) {
		t.Fatalf("Build = %+v, %v; want a StepError", res, err)
	}
	if se.Line != 3 || se.ExitCode != 7 || !strings.Contains(se.Output, "before-failing") || !strings.Contains(se.Output, "on-stderr") ||
		!strings.Contains(err.Error(), "Dockerfile:3:") {
		t.Errorf("error = %+v (%v)", se, err)
	}
	if _, err := os.Stat(o.Out); err == nil {
		t.Error("a failed build wrote its output")
	}
	if entries, _ := os.ReadDir(o.CacheDir); slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), "build-") }) {
		t.Errorf("a failed build left its working directory: %v", entries)
	}
}

// A RUN step writes into its own root, never the host's, and has no network.
func TestRunConfined(t *testing.T) {
	base := baseImage(t)
	hostDir := t.TempDir()
	df := "FROM " + base + "\nRUN mkdir -p " + hostDir + " && echo escaped > " + hostDir + "/escaped\n"
	o := options(t, t.TempDir(), df, sharedCache)
	res, err := build(t, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "escaped")); err == nil {
		t.Error("a RUN step wrote to the host")
	}
	if data, err := os.ReadFile(filepath.Join(unpack(t, res).Dir, hostDir, "escaped")); err != nil || string(data) != "escaped\n" {
		t.Errorf("the image's %s/escaped = %q, %v; want the step's write", hostDir, data, err)
	}

	t.Run("no network", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		accepted := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				accepted++
				mu.Unlock()
				c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		df := fmt.Sprintf("FROM %s\nRUN python3 -c \"import socket; socket.create_connection(('127.0.0.1', %d), 5); print('connected')\"\n", base, port)
		_, err = build(t, options(t, t.TempDir(), df, sharedCache))
		ln.Close()
		<-done
		var se *templatebuild.StepError
		if !errors.As(err, &se) || strings.Contains(se.Output, "connected") {
			t.Errorf("Build = %v; want the connection to fail", err)
		}
		if accepted != 0 {
			t.Errorf("the host's listener accepted %d connections from a RUN step", accepted)
		}
	})

	// A step is bounded like the code agents run: one that takes more memory than its
	// sandbox has is stopped and fails the build at its line; one that forks past its task
	// limit is refused the fork.
	t.Run("limits", func(t *testing.T) {
		df := "FROM " + base + "\nRUN true\nRUN python3 -c \"b = bytearray(512 << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')\"\n"
		o := options(t, t.TempDir(), df, sharedCache)
		o.StepMemory = 256 << 20
		_, err := build(t, o)
		if err == nil || !strings.Contains(err.Error(), "Dockerfile:3") {
			t.Fatalf("a step past its memory: %v, want the build failed at line 3", err)
		}
		var se *templatebuild.StepError
		if errors.As(err, &se) && strings.Contains(se.Output, "allocated") {
			t.Errorf("the step allocated 512 MiB in a 256 MiB sandbox: %v", err)
		}
		t.Logf("past its memory: %v", err)
		// Each child sleeps and exits; the parent keeps forking until a fork fails.
		df = "FROM " + base + "\nRUN python3 -c \"import os, time; kids = [p for p in (os.fork() for _ in range(64)) if p or time.sleep(5) or os._exit(0)]; print('forked')\"\n"
		o = options(t, t.TempDir(), df, sharedCache)
		o.StepTasks = 32
		_, err = build(t, o)
		if !errors.As(err, &se) || se.Line != 2 || strings.Contains(se.Output, "forked") || !strings.Contains(se.Output, "Resource temporarily unavailable") {
			t.Fatalf("a step past its tasks: %v, want the build failed at line 2 by a refused fork", err)
		}
	})
}

// fakeRunsc returns a runsc that records being run, for builds that must run nothing.
func fakeRunsc(t *testing.T) (bin, marker string) {
	dir := t.TempDir()
	marker = filepath.Join(dir, "ran")
	bin = filepath.Join(dir, "runsc")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\ntouch "+marker+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, marker
}

func TestRefused(t *testing.T) {
	ctxDir := t.TempDir()
	outside := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{"ok.txt": "ok\n", "dir/f": "f\n"})
	writeFiles(t, outside, map[string]string{"secret": "secret\n"})
	for name, target := range map[string]string{
		"abs-link":    filepath.Join(outside, "secret"),
		"rel-link":    "../" + filepath.Base(outside) + "/secret",
		"dir-link":    outside,
		"inside-link": "ok.txt",
	} {
		if err := os.Symlink(target, filepath.Join(ctxDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../"+filepath.Base(outside), filepath.Join(ctxDir, "dir", "up")); err != nil {
		t.Fatal(err)
	}

	t.Run("before anything runs", func(t *testing.T) {
		for _, c := range []struct {
			name, df string
			line     int
		}{
			{"EXPOSE", "FROM /nonexistent@sha256:0000\nRUN true\nEXPOSE 80\n", 3},
			{"parent source", "FROM /nonexistent\nCOPY ../x /x\n", 2},
			{"absolute source", "FROM /nonexistent\nRUN true\nCOPY /etc/passwd /x\n", 3},
		} {
			t.Run(c.name, func(t *testing.T) {
				bin, marker := fakeRunsc(t)
				o := templatebuild.Options{DockerfileData: []byte(c.df), Context: ctxDir, Tag: "x", Out: filepath.Join(t.TempDir(), "out"), CacheDir: t.TempDir(), Runsc: bin}
				_, err := build(t, o)
				var de *dockerfile.Error
				if !errors.As(err, &de) || de.Line != c.line {
					t.Errorf("Build = %v, want a Dockerfile error on line %d", err, c.line)
				}
				if _, err := os.Stat(marker); err == nil {
					t.Error("runsc ran")
				}
			})
		}
	})

	t.Run("context links leading outside", func(t *testing.T) {
		base := baseImage(t)
		cache := sharedCache
		for _, c := range []struct{ name, src string }{
			{"absolute link", "abs-link"},
			{"relative link", "rel-link"},
			{"link to a directory outside", "dir-link/secret"},
			{"pattern through a link", "dir-l*/secret"},
			{"link in a subdirectory", "dir/up/secret"},
		} {
			t.Run(c.name, func(t *testing.T) {
				bin, marker := fakeRunsc(t)
				df := "FROM " + base + "\nCOPY ok.txt /ok\nCOPY " + c.src + " /x\n"
				o := templatebuild.Options{DockerfileData: []byte(df), Context: ctxDir, Tag: "x", Out: filepath.Join(t.TempDir(), "out"), CacheDir: cache, Runsc: bin}
				_, err := build(t, o)
				if err == nil || !strings.Contains(err.Error(), "Dockerfile:3:") {
					t.Errorf("Build = %v, want a refusal naming line 3", err)
				}
				if err != nil && strings.Contains(err.Error(), "no file of the build context matches") && !strings.Contains(c.src, "*") {
					t.Errorf("Build = %v: want the link refused, not missed", err)
				}
				if _, err := os.Stat(marker); err == nil {
					t.Error("runsc ran")
				}
				if _, err := os.Stat(o.Out); err == nil {
					t.Error("a refused build wrote its output")
				}
			})
		}
	})

	t.Run("links inside the context", func(t *testing.T) {
		bin, _ := fakeRunsc(t)
		df := "FROM " + baseImage(t) + "\nCOPY inside-link /copied\nCOPY dir /d/\n"
		o := templatebuild.Options{DockerfileData: []byte(df), Context: ctxDir, Tag: "x", Out: filepath.Join(t.TempDir(), "out"), CacheDir: sharedCache, Runsc: bin,
			Epoch: time.Unix(1767225600, 0)}
		res, err := build(t, o)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		r := unpack(t, res)
		if data, err := os.ReadFile(filepath.Join(r.Dir, "copied")); err != nil || string(data) != "ok\n" {
			t.Errorf("/copied = %q, %v; want the link's target's content", data, err)
		}
		// A link inside a copied directory is copied as a link (resolved in the image).
		if target, err := os.Readlink(filepath.Join(r.Dir, "d/up")); err != nil || !strings.HasPrefix(target, "../../") {
			t.Errorf("/d/up = %q, %v; want the link itself", target, err)
		}
	})

}

// tarball returns a tar archive of hdrs (a regular file's content is its Linkname's here:
// the test's shorthand), gzip-compressed with gz.
func tarball(t *testing.T, gz bool, hdrs ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, h := range hdrs {
		data := ""
		if h.Typeflag == tar.TypeReg {
			data, h.Linkname = h.Linkname, ""
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(data))
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

// ADD unpacks a local tar archive (plain or gzip) into its destination directory with the
// archive's owners and modes, links included, as Docker's ADD does; a gzip file that holds no
// archive is copied as it is; an entry leaving the destination, a device node, and a file of
// a compression this build cannot unpack are refused with the step's line.
func TestAddArchive(t *testing.T) {
	bin, _ := fakeRunsc(t)
	base := baseImage(t)
	dir := t.TempDir()
	files := map[string][]byte{
		"app.tar.gz": tarball(t, true,
			tar.Header{Name: "pkg/", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 1000, Gid: 1000},
			tar.Header{Name: "pkg/a.txt", Typeflag: tar.TypeReg, Mode: 0o640, Uid: 1000, Gid: 1000, Linkname: "alpha\n"},
			tar.Header{Name: "pkg/link", Typeflag: tar.TypeSymlink, Linkname: "a.txt"},
			tar.Header{Name: "pkg/hard", Typeflag: tar.TypeLink, Linkname: "pkg/a.txt"},
			tar.Header{Name: "./top.sh", Typeflag: tar.TypeReg, Mode: 0o755, Linkname: "echo top\n"}),
		"plain.tar":    tarball(t, false, tar.Header{Name: "p.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "plain\n"}),
		"notes.txt.gz": gzipped(t, "not an archive\n"),
		"evil.tar":     tarball(t, false, tar.Header{Name: "../../evil", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}),
		"dev.tar":      tarball(t, false, tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}),
		"data.tar.xz":  {0xfd, '7', 'z', 'X', 'Z', 0x00, 1, 2},
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	df := "FROM " + base + "\nADD app.tar.gz /opt/app\nADD plain.tar notes.txt.gz /srv/\n"
	o := templatebuild.Options{DockerfileData: []byte(df), Context: dir, Tag: "x", Out: filepath.Join(t.TempDir(), "out"), CacheDir: sharedCache, Runsc: bin,
		Epoch: time.Unix(1767225600, 0)}
	res, err := build(t, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	r := unpack(t, res)
	for p, want := range map[string]string{
		"opt/app/pkg/a.txt": "alpha\n", "opt/app/pkg/hard": "alpha\n", "opt/app/top.sh": "echo top\n",
		"srv/p.txt": "plain\n", "srv/notes.txt.gz": string(files["notes.txt.gz"]),
	} {
		if data, err := os.ReadFile(filepath.Join(r.Dir, p)); err != nil || string(data) != want {
			t.Errorf("/%s = %q, %v; want %q", p, data, err, want)
		}
	}
	if uid, gid, mode := owner(t, filepath.Join(r.Dir, "opt/app/pkg/a.txt")); uid != 1000 || gid != 1000 || mode.Perm() != 0o640 {
		t.Errorf("/opt/app/pkg/a.txt: %d:%d %v, want the archive's 1000:1000 0640", uid, gid, mode)
	}
	if _, _, mode := owner(t, filepath.Join(r.Dir, "opt/app/pkg")); mode.Perm() != 0o750 {
		t.Errorf("/opt/app/pkg: %v, want the archive's 0750", mode)
	}
	if target, err := os.Readlink(filepath.Join(r.Dir, "opt/app/pkg/link")); err != nil || target != "a.txt" {
		t.Errorf("/opt/app/pkg/link = %q, %v", target, err)
	}
	for _, c := range []struct{ src, want string }{
		{"evil.tar", "leaves the destination"},
		{"dev.tar", "character device"},
		{"data.tar.xz", "xz-compressed"},
	} {
		o.DockerfileData = []byte("FROM " + base + "\nADD " + c.src + " /x/\n")
		o.Out = filepath.Join(t.TempDir(), "out")
		if _, err := build(t, o); err == nil || !strings.Contains(err.Error(), "Dockerfile:2:") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ADD %s: %v, want it refused on line 2 with %q", c.src, err, c.want)
		}
	}
}

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(s))
	zw.Close()
	return buf.Bytes()
}

// A .dockerignore in the context leaves out what Docker's builder leaves out: the files it
// names are neither copied nor in the step's cache key, and a source it leaves out is refused.
func TestDockerignore(t *testing.T) {
	bin, _ := fakeRunsc(t)
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		".dockerignore":         "# outputs\n**/*.log\nbuild\nnode_modules\n!node_modules/keep.js\n",
		"app.py":                "print(1)\n",
		"debug.log":             "noise\n",
		"build/out.o":           "binary\n",
		"node_modules/lib/x.js": "x\n",
		"node_modules/keep.js":  "kept\n",
		"src/main.py":           "main\n",
		"src/trace.log":         "noise\n",
	})
	df := "FROM " + baseImage(t) + "\nCOPY . /app/\n"
	o := templatebuild.Options{DockerfileData: []byte(df), Context: dir, Tag: "x", Out: filepath.Join(t.TempDir(), "out"), CacheDir: sharedCache, Runsc: bin,
		Epoch: time.Unix(1767225600, 0)}
	res, err := build(t, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	r := unpack(t, res)
	for p, want := range map[string]bool{
		"app/app.py": true, "app/src/main.py": true, "app/node_modules/keep.js": true, "app/.dockerignore": true,
		"app/debug.log": false, "app/src/trace.log": false, "app/build": false, "app/node_modules/lib": false,
	} {
		if _, err := os.Lstat(filepath.Join(r.Dir, p)); (err == nil) != want {
			t.Errorf("/%s in the image: %v, want %v", p, err == nil, want)
		}
	}
	// A change to a left-out file changes nothing: the step comes from the cache, and the
	// image is the same.
	os.WriteFile(filepath.Join(dir, "debug.log"), []byte("more noise\n"), 0o644)
	o.Out = filepath.Join(t.TempDir(), "out")
	again, err := build(t, o)
	if err != nil || again.Digest != res.Digest || again.Cached != 1 {
		t.Errorf("rebuild after a left-out file changed: %+v, %v; want the cached step and digest %s", again, err, res.Digest)
	}
	// A source the file leaves out is refused, naming it.
	o.DockerfileData = []byte("FROM " + baseImage(t) + "\nCOPY debug.log /x\n")
	if _, err := build(t, o); err == nil || !strings.Contains(err.Error(), ".dockerignore excludes") || !strings.Contains(err.Error(), "Dockerfile:2") {
		t.Errorf("COPY of a left-out file: %v", err)
	}
}

func TestNewRefusesMissingOptions(t *testing.T) {
	bin, _ := fakeRunsc(t)
	ok := templatebuild.Options{DockerfileData: []byte("FROM x\n"), Context: t.TempDir(), Tag: "t", Out: "/tmp/o", CacheDir: "/tmp/c", Runsc: bin}
	for _, c := range []struct {
		name string
		edit func(*templatebuild.Options)
	}{
		{"no Dockerfile", func(o *templatebuild.Options) { o.DockerfileData = nil }},
		{"no context", func(o *templatebuild.Options) { o.Context = "" }},
		{"no tag", func(o *templatebuild.Options) { o.Tag = "" }},
		{"tag with a space", func(o *templatebuild.Options) { o.Tag = "a b" }},
		{"no out", func(o *templatebuild.Options) { o.Out = "" }},
		{"no cache", func(o *templatebuild.Options) { o.CacheDir = "" }},
		{"no runsc", func(o *templatebuild.Options) { o.Runsc = "" }},
		{"missing runsc", func(o *templatebuild.Options) { o.Runsc = "/nonexistent/runsc" }},
		{"malformed egress entry", func(o *templatebuild.Options) { o.Egress, o.SandboxBinary = []string{"example.com"}, bin }},
		{"egress without fusebox-sandbox", func(o *templatebuild.Options) { o.Egress = []string{"example.com:443"} }},
		{"missing fusebox-sandbox", func(o *templatebuild.Options) {
			o.Egress, o.SandboxBinary = []string{"example.com:443"}, "/nonexistent/fusebox-sandbox"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := ok
			c.edit(&o)
			if _, err := templatebuild.New(o); err == nil {
				t.Error("New accepted it")
			}
		})
	}
	if _, err := templatebuild.New(ok); err != nil {
		t.Errorf("New(%+v) = %v", ok, err)
	}
}
