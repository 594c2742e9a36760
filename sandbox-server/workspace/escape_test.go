package workspace

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// TestEscapes tries to leave the workspace through every method and checks that each attempt
// is refused and that nothing outside the workspace was created or changed.
func TestEscapes(t *testing.T) {
	e := newEnv(t)
	e.addEvilLinks(t)
	ctx := context.Background()
	w := e.w

	write := func(p string) func() error {
		return func() error {
			_, err := w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: p, Data: []byte("pwned")}}})
			return err
		}
	}
	stream := func(p string) func() error {
		return func() error {
			_, err := w.WriteStream(ctx, &sandboxv1.WriteFileHeader{Path: p}, chunks("pwned"))
			return err
		}
	}
	readPlan := func(p string) func() error {
		return func() error {
			_, err := w.ReadPlan(ctx, &sandboxv1.GetReadFilesPlanRequest{Paths: []string{p}})
			return err
		}
	}
	readFiles := func(p string) func() error {
		return func() error {
			_, err := w.ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{p}})
			return err
		}
	}
	readStream := func(p string) func() error {
		return func() error {
			return w.ReadStream(ctx, &sandboxv1.ReadFileStreamRequest{Path: p}, func(*sandboxv1.ReadFileChunk) error { return nil })
		}
	}
	stat := func(p string, follow bool) func() error {
		return func() error {
			_, err := w.Stat(ctx, &sandboxv1.StatRequest{Path: p, FollowSymlinks: follow})
			return err
		}
	}
	list := func(p string) func() error {
		return func() error {
			_, err := w.List(ctx, &sandboxv1.ListRequest{Path: p, Recursive: true})
			return err
		}
	}
	find := func(p string) func() error {
		return func() error {
			_, err := w.Find(ctx, &sandboxv1.FindRequest{Path: p})
			return err
		}
	}
	grep := func(p string) func() error {
		return func() error {
			_, err := w.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "secret", Paths: []string{p}})
			return err
		}
	}
	rename := func(from, to string) func() error {
		return func() error { return w.Rename(ctx, &sandboxv1.RenameRequest{From: from, To: to, Overwrite: true}) }
	}
	remove := func(p string, recursive bool) func() error {
		return func() error { return w.Remove(ctx, &sandboxv1.RemoveRequest{Path: p, Recursive: recursive}) }
	}
	mkdir := func(p string) func() error {
		return func() error { return w.Mkdir(ctx, &sandboxv1.MkdirRequest{Path: p, Parents: true}) }
	}
	symlink := func(target, p string) func() error {
		return func() error { return w.Symlink(ctx, &sandboxv1.SymlinkRequest{Target: target, Path: p}) }
	}
	batchLink := func(target, p string) func() error {
		return func() error {
			_, err := w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Symlinks: []*sandboxv1.SymlinkSpec{{Target: target, Path: p}}})
			return err
		}
	}
	batchMkdir := func(p string) func() error {
		return func() error {
			_, err := w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Mkdirs: []string{p}})
			return err
		}
	}
	long := strings.Repeat("n", 300)

	tests := []struct {
		name string
		call func() error
	}{
		{"write ..", write("..")},
		{"write ../x", write("../x")},
		{"write ../outside/secret", write("../outside/secret")},
		{"write /etc/passwd", write("/etc/passwd")},
		{"write a/../../etc", write("a/../../etc")},
		{"write mount then ..", write("/workspace/../outside/secret")},
		{"write through abs dir link", write("evil/secret")},
		{"write new file through abs dir link", write("evil/new")},
		{"write through relative dir link", write("evilrel/secret")},
		{"write through link chain", write("chain1/new")},
		{"write through mid-path link", write("sub/mid/new")},
		{"write through mid-path link to subdir", write("sub/upout/new")},
		{"write through /etc link", write("etc/pwned")},
		{"write /proc/self/root", write("/proc/self/root/etc/pwned")},
		{"write through /proc link", write("procroot/tmp/pwned")},
		{"write NUL", write("a\x00b")},
		{"write 300-byte name", write(long)},
		{"write the root", write(".")},
		{"stream through abs dir link", stream("evil/big")},
		{"stream ../x", stream("../x")},
		{"stream through link chain", stream("chain2/big")},
		{"batch mkdir through link", batchMkdir("evil/newdir")},
		{"batch mkdir ..", batchMkdir("../newdir")},
		{"batch symlink absolute target", batchLink("/etc", "l1")},
		{"batch symlink escaping target", batchLink("../outside", "l2")},
		{"batch symlink escaping from subdir", batchLink("../../outside", "sub/l3")},
		{"batch symlink inside evil dir", batchLink("x", "evil/l4")},
		{"symlink absolute target", symlink("/etc/passwd", "l5")},
		{"symlink absolute target under mount", symlink("/workspace/sub", "l6")},
		{"symlink escaping relative target", symlink("sub/../../outside", "l7")},
		{"symlink /proc", symlink("/proc/self/root", "l8")},
		{"symlink placed through evil dir", symlink("secret", "evil/l9")},
		{"symlink NUL target", symlink("a\x00", "l10")},
		{"mkdir through link", mkdir("evil/d/e")},
		{"mkdir ..", mkdir("../d")},
		{"mkdir absolute", mkdir("/tmp/fusebox-escape-test")},
		{"rename into escaping dir", rename("sub/a", "evil/a")},
		{"rename out of escaping dir", rename("evil/secret", "stolen")},
		{"rename out of relative escaping dir", rename("evilrel/sub", "stolen")},
		{"rename ../", rename("../outside/secret", "stolen")},
		{"rename root", rename(".", "x")},
		{"rename over root", rename("sub", "/workspace")},
		{"remove through link", remove("evil/secret", false)},
		{"remove recursive through link", remove("evilrel/sub", true)},
		{"remove through mid-path link", remove("sub/mid/secret", false)},
		{"remove ..", remove("..", true)},
		{"remove root", remove("/workspace", true)},
		{"stat through link", stat("evil/secret", false)},
		{"stat follow abs file link", stat("fileout", true)},
		{"stat follow relative file link", stat("filerel", true)},
		{"stat /etc/passwd", stat("/etc/passwd", false)},
		{"list through link", list("evil")},
		{"list ..", list("..")},
		{"list /proc link", list("procroot")},
		{"find through link", find("chain1")},
		{"find /", find("/")},
		{"grep through link", grep("evil")},
		{"grep file link", grep("fileout")},
		{"grep /etc", grep("/etc")},
		{"read plan through link", readPlan("evil/secret")},
		{"read plan file link", readPlan("filerel")},
		{"read plan ../ glob", readPlan("../outside/*")},
		{"read plan glob through link", readPlan("evil/*")},
		{"read plan ** through link", readPlan("chain1/**")},
		{"read files abs file link", readFiles("fileout")},
		{"read files through link", readFiles("evil/secret")},
		{"read files /etc/passwd", readFiles("/etc/passwd")},
		{"read files /proc link", readFiles("procroot/etc/passwd")},
		{"read stream file link", readStream("fileout")},
		{"read stream through mid-path link", readStream("sub/mid/secret")},
		{"read stream ../", readStream("../outside/secret")},
	}
	beforeOut := snapshot(t, e.outside)
	beforeBase := snapshot(t, filepath.Dir(e.dir))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !isRefused(err) {
				t.Fatalf("got %v, want ErrEscape or ErrInvalidPath", err)
			}
			t.Log(err)
			assertSameTree(t, "outside", beforeOut, snapshot(t, e.outside))
		})
	}
	if _, err := os.Stat("/tmp/fusebox-escape-test"); err == nil {
		t.Error("/tmp/fusebox-escape-test was created")
	}

	// Writing over an evil link replaces the link inside the workspace, never its target.
	t.Run("overwrite evil links", func(t *testing.T) {
		for _, p := range []string{"fileout", "filerel"} {
			if err := write(p)(); err != nil {
				t.Fatalf("writing over %s: %v", p, err)
			}
			if got := readHost(t, filepath.Join(e.dir, p)); got != "pwned" {
				t.Fatalf("%s = %q", p, got)
			}
		}
		// Removing a link removes the link.
		if err := remove("evil", true)(); err != nil {
			t.Fatal(err)
		}
		assertSameTree(t, "outside", beforeOut, snapshot(t, e.outside))
	})
	// Nothing appeared beside the workspace either.
	afterBase := snapshot(t, filepath.Dir(e.dir))
	for k := range afterBase {
		if !strings.HasPrefix(k, "ws") {
			if _, ok := beforeBase[k]; !ok {
				t.Errorf("created outside the workspace: %s", k)
			}
		}
	}
}

// TestEscapeRace swaps a directory for a symlink to the outside while writes, reads and
// removals run through it: the jail must never let one through.
func TestEscapeRace(t *testing.T) {
	e := newEnv(t)
	before := snapshot(t, e.outside)
	ctx := context.Background()
	swap := filepath.Join(e.dir, "swap")
	mustMkdir(t, filepath.Join(e.dir, "real"))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			target := "real"
			if i%2 == 0 {
				target = e.outside
			}
			tmp := swap + ".tmp"
			os.Remove(tmp)
			os.Symlink(target, tmp)
			if os.Rename(tmp, swap) != nil {
				// A write recreated swap as a directory while it was briefly missing.
				os.RemoveAll(swap)
				os.Rename(tmp, swap)
			}
		}
	})
	for range 300 {
		e.w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: "swap/secret", Data: []byte("pwned")}, {Path: "swap/sub/x", Data: []byte("pwned")}}})
		e.w.WriteStream(ctx, &sandboxv1.WriteFileHeader{Path: "swap/secret"}, chunks("pwned"))
		e.w.Remove(ctx, &sandboxv1.RemoveRequest{Path: "swap/sub", Recursive: true})
		e.w.Rename(ctx, &sandboxv1.RenameRequest{From: "swap/secret", To: "stolen", Overwrite: true})
		e.w.Mkdir(ctx, &sandboxv1.MkdirRequest{Path: "swap/newdir", Parents: true})
		if resp, err := e.w.ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{"swap/secret"}}); err == nil && strings.Contains(string(resp.Files[0].Data), "outside") {
			t.Fatal("read a file outside the workspace")
		}
	}
	close(stop)
	wg.Wait()
	assertSameTree(t, "outside", before, snapshot(t, e.outside))
}

// chunks returns a next func that yields each string once, then io.EOF.
func chunks(parts ...string) func() ([]byte, error) {
	return func() ([]byte, error) {
		if len(parts) == 0 {
			return nil, io.EOF
		}
		b := []byte(parts[0])
		parts = parts[1:]
		return b, nil
	}
}
