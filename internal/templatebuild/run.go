package templatebuild

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/userdb"
)

// removeTimeout bounds the removal of a step's container after the build's context ended.
const removeTimeout = 30 * time.Second

// runStep runs the RUN step s (the build's step i) in a fresh sandbox whose writable root is
// root, under the relay to the egress proxy when the build has an allowlist.
func (bd *build) runStep(ctx context.Context, i int, s dockerfile.Step, text, root string) (err error) {
	user := s.User
	if user == "" {
		user = bd.base.cf.Config.User
	}
	uid, gid, err := userdb.LookupDir(root, user)
	if err != nil {
		return fmt.Errorf("Dockerfile:%d: RUN: %w", s.Line, err)
	}
	// As Docker does, a missing working directory is created (by root).
	if err := mkdirOwned(root, s.Workdir, 0, 0); err != nil {
		return fmt.Errorf("Dockerfile:%d: RUN: creating the working directory %s: %w", s.Line, s.Workdir, err)
	}
	argv := s.Argv
	if argv == nil {
		argv = []string{"/bin/sh", "-c", s.Shell}
	}
	env := s.Environ(bd.baseEnv)
	if !hasEnv(env, "HOME") {
		env = append(env, "HOME="+homeOf(root, uid))
	}
	var mounts []runsc.Mount
	if bd.egress != nil {
		argv, mounts = bd.egress.wrap(argv)
		before, berr := mountPointsBefore(root)
		if berr != nil {
			return fmt.Errorf("Dockerfile:%d: RUN: %w", s.Line, berr)
		}
		// Deferred before the sandbox's removal, so it runs after it: the file server that
		// made the mount points is gone.
		defer func() {
			if rerr := restoreMountPoints(root, before); rerr != nil && err == nil {
				err = fmt.Errorf("Dockerfile:%d: RUN: %w", s.Line, rerr)
			}
		}()
	}
	bundle := filepath.Join(bd.work, fmt.Sprintf("bundle-%d", i+1))
	if err := runsc.WriteBundle(runsc.BundleSpec{
		Dir: bundle, RootFS: root, RootWritable: true, Capabilities: buildCaps,
		Args: argv, Env: env, Cwd: s.Workdir, UID: uid, GID: gid, Hostname: "build",
		MemoryLimitBytes: bd.o.StepMemory, ProcessLimit: bd.o.StepTasks, Mounts: mounts,
	}); err != nil {
		return fmt.Errorf("Dockerfile:%d: RUN: %w", s.Line, err)
	}
	defer os.RemoveAll(bundle)
	// Random, not the step's number: runsc names the sandbox's host cgroup after its id, and
	// two builds on one machine must not share one.
	id := runsc.ID("build", rand.Uint64N(runsc.MaxIDNumber+1))
	defer func() {
		// Run deleted the container unless it was cut short; Remove is idempotent.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
		defer cancel()
		if rmErr := bd.rt.Remove(rctx, id); rmErr != nil && err == nil {
			err = fmt.Errorf("Dockerfile:%d: RUN: removing its sandbox: %w", s.Line, rmErr)
		}
	}()
	out := newStepOutput(bd.o.Progress, "    ")
	code, err := bd.rt.Run(ctx, id, bundle, out, out)
	out.Flush()
	if err != nil {
		return fmt.Errorf("Dockerfile:%d: %s: %w", s.Line, text, err)
	}
	if code != 0 {
		return &StepError{Line: s.Line, Instruction: text, ExitCode: code, Output: out.Tail()}
	}
	return nil
}

func hasEnv(env []string, k string) bool {
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			return true
		}
	}
	return false
}

// homeOf returns the home directory of uid in the root's /etc/passwd: / if it has none,
// /root for root (as Docker sets HOME).
func homeOf(root string, uid uint32) string {
	def := "/"
	if uid == 0 {
		def = "/root"
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return def
	}
	defer r.Close()
	if home, ok := userdb.Home(r, uid); ok {
		return home
	}
	return def
}

// Output kept for a failed step's error.
const (
	tailLines = 20
	tailBytes = 4 << 10
)

// stepOutput writes a step's output to the progress writer a line at a time, each prefixed,
// and keeps its last lines. Its stdout and stderr write from two goroutines.
type stepOutput struct {
	mu     sync.Mutex // guards everything below
	w      io.Writer
	prefix string
	line   []byte   // the current line, not yet ended
	tail   []string // the last lines
}

func newStepOutput(w io.Writer, prefix string) *stepOutput {
	return &stepOutput{w: w, prefix: prefix}
}

// Write implements io.Writer.
func (o *stepOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			o.line = append(o.line, p...)
			if len(o.line) > tailBytes { // a line without end is still shown
				o.endLine()
			}
			break
		}
		o.line = append(o.line, p[:i]...)
		o.endLine()
		p = p[i+1:]
	}
	return n, nil
}

// endLine writes the current line. Errors of the progress writer do not fail the step.
func (o *stepOutput) endLine() {
	l := string(o.line)
	o.line = o.line[:0]
	fmt.Fprintf(o.w, "%s%s\n", o.prefix, l)
	o.tail = append(o.tail, l)
	if len(o.tail) > tailLines {
		o.tail = o.tail[len(o.tail)-tailLines:]
	}
}

// Flush writes a last line that did not end.
func (o *stepOutput) Flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.line) > 0 {
		o.endLine()
	}
}

// Tail returns the last lines written, at most tailBytes.
func (o *stepOutput) Tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := strings.Join(o.tail, "\n")
	if len(s) > tailBytes {
		s = s[len(s)-tailBytes:]
	}
	return s
}
