package jsonfile

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

func TestRoundTripLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.json")
	if err := Write(p, map[string]string{"a": "1"}); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := Read(p, &got); err != nil || got["a"] != "1" {
		t.Fatalf("Read = %v, %v", got, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the file", len(entries))
	}
	if err := Write(filepath.Join(dir, "missing", "x.json"), 1); err == nil {
		t.Fatal("wrote into a missing directory")
	}
}

// A prepared path's Write fills the file Prepare made (same inode) and leaves no temp behind.
func TestPrepareLendsItsInode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.json")
	if err := Prepare(p); err != nil {
		t.Fatal(err)
	}
	before := inode(t, p+".tmp")
	if err := Write(p, map[string]string{"a": "1"}); err != nil {
		t.Fatal(err)
	}
	if after := inode(t, p); after != before {
		t.Errorf("Write made inode %d, not the prepared %d", after, before)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file", len(entries))
	}
	if err := Prepare(filepath.Join(dir, "missing", "x.json")); err == nil {
		t.Error("prepared a file in a missing directory")
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// BenchmarkWrite writes a lease's annotations into a fresh file and into a prepared one, in a
// directory where files come and go as in a manager's state directory: before each write, 100
// files are made and removed beside it (a sandbox's bundle, sockets and logs are some dozens).
// On ext4 without a journal (this project's CI machines) the fresh file's inode search skips
// every inode deleted in the last minute.
func BenchmarkWrite(b *testing.B) {
	ann := map[string]string{"fusebox.dev/lease-expires": "2026-12-01T05:00:00Z", "fusebox.dev/egress": "example.com:443"}
	for _, prepared := range []bool{false, true} {
		name := map[bool]string{false: "fresh", true: "prepared"}[prepared]
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				for j := range 100 {
					f := filepath.Join(dir, "churn"+strconv.Itoa(j))
					if err := os.WriteFile(f, nil, 0o600); err != nil {
						b.Fatal(err)
					}
					if err := os.Remove(f); err != nil {
						b.Fatal(err)
					}
				}
				p := filepath.Join(dir, "annotations"+strconv.Itoa(i)+".json")
				if prepared {
					if err := Prepare(p); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if err := Write(p, ann); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
