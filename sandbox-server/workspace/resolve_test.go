package workspace

import (
	"errors"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	e := newEnv(t)
	long := strings.Repeat("x", 256)
	tests := []struct {
		in      string
		want    string
		wantErr error
	}{
		{in: "a", want: "a"},
		{in: "a/b/c.txt", want: "a/b/c.txt"},
		{in: "./a//b/", want: "a/b"},
		{in: "a/./b/../c", want: "a/c"},
		{in: ".", want: "."},
		{in: "a/..", want: "."},
		{in: "...", want: "..."},
		{in: "..a/b", want: "..a/b"},
		{in: "a\\..\\..\\b", want: "a\\..\\..\\b"}, // backslash is a name character
		{in: strings.Repeat("x", 255), want: strings.Repeat("x", 255)},
		{in: "/workspace", want: "."},
		{in: "/workspace/", want: "."},
		{in: "/workspace/src/a.go", want: "src/a.go"},
		{in: "//workspace//src/../b", want: "b"},
		{in: "", wantErr: ErrInvalidPath},
		{in: "a\x00b", wantErr: ErrInvalidPath},
		{in: "\x00", wantErr: ErrInvalidPath},
		{in: long, wantErr: ErrInvalidPath},
		{in: "a/" + long + "/b", wantErr: ErrInvalidPath},
		{in: strings.Repeat("a/", 2049), wantErr: ErrInvalidPath},
		{in: "..", wantErr: ErrEscape},
		{in: "../x", wantErr: ErrEscape},
		{in: "a/../../b", wantErr: ErrEscape},
		{in: "./../", wantErr: ErrEscape},
		{in: "/", wantErr: ErrEscape},
		{in: "/etc/passwd", wantErr: ErrEscape},
		{in: "/workspacex/a", wantErr: ErrEscape},
		{in: "/workspace/../etc", wantErr: ErrEscape},
		{in: "/workspace/../workspace2", wantErr: ErrEscape},
		{in: "/proc/self/root/etc/passwd", wantErr: ErrEscape},
		{in: "/proc/self/cwd/x", wantErr: ErrEscape},
	}
	for _, tt := range tests {
		t.Run(strings.ToValidUTF8(short(tt.in), "?"), func(t *testing.T) {
			got, err := e.w.Resolve(tt.in)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Resolve(%q) = %q, %v; want %v", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Resolve(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestResolveMountRoot(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MountPath = "/" })
	for in, want := range map[string]string{"/": ".", "/etc/passwd": "etc/passwd", "a": "a"} {
		if got, err := e.w.Resolve(in); err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestOpenOptions(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/f"
	mustWrite(t, file, "x")
	tests := []struct {
		name string
		opts Options
	}{
		{"no dir", Options{MountPath: "/w"}},
		{"no mount", Options{Dir: dir}},
		{"relative mount", Options{Dir: dir, MountPath: "w"}},
		{"missing dir", Options{Dir: dir + "/nope", MountPath: "/w"}},
		{"file dir", Options{Dir: file, MountPath: "/w"}},
		{"negative limit", Options{Dir: dir, MountPath: "/w", MaxFileBytes: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if w, err := Open(tt.opts); err == nil {
				w.Close()
				t.Fatal("Open succeeded")
			}
		})
	}
}
