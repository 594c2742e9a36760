package client

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

func TestPruneMkdirs(t *testing.T) {
	tests := []struct {
		in, want []string
	}{
		{[]string{"a/b/c", "a/b/d", "a/b"}, []string{"a/b/c", "a/b/d"}},
		{[]string{"a", "a/b", "a/b/c"}, []string{"a/b/c"}},
		{[]string{"a/b", "a/b/", "./a/b"}, []string{"a/b"}},
		{[]string{"ab", "a"}, []string{"a", "ab"}},
		{[]string{"a", "a-b/c", "a/b"}, []string{"a-b/c", "a/b"}},
		{[]string{".", "", "x"}, []string{"x"}},
		{nil, []string{}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.in), func(t *testing.T) {
			got := PruneMkdirs(tc.in)
			if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Fatalf("PruneMkdirs(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestPruneMkdirsProperty: every input directory is implied by (is a prefix-ancestor of, or
// equal to) some output directory, and no output implies another.
func TestPruneMkdirsProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	parts := []string{"a", "b", "ab", "a-b", "c"}
	for range 500 {
		var in []string
		for range rng.IntN(12) {
			p := parts[rng.IntN(len(parts))]
			for range rng.IntN(4) {
				p += "/" + parts[rng.IntN(len(parts))]
			}
			in = append(in, p)
		}
		out := PruneMkdirs(in)
		under := func(d, e string) bool { return d == e || len(e) > len(d) && e[:len(d)] == d && e[len(d)] == '/' }
		for _, d := range in {
			if !slices.ContainsFunc(out, func(e string) bool { return under(d, e) }) {
				t.Fatalf("%q lost from %q -> %q", d, in, out)
			}
		}
		for i, d := range out {
			for j, e := range out {
				if i != j && under(d, e) {
					t.Fatalf("%q implied by %q in %q", d, e, out)
				}
			}
		}
	}
}

func TestPackProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		limit := 1000 + rng.IntN(20000)
		var files []*sandboxv1.FileWrite
		for i := range rng.IntN(300) {
			size := rng.IntN(limit / 3)
			if rng.IntN(20) == 0 {
				size = limit + rng.IntN(limit) // too big for any batch
			}
			files = append(files, &sandboxv1.FileWrite{Path: fmt.Sprintf("d%d/f%04d", i%7, i), Data: make([]byte, size)})
		}
		mkdirs := []string{"d0", "d1/x"}
		links := []*sandboxv1.SymlinkSpec{{Target: "f0001", Path: "d0/link"}}
		batches, streamed := pack(files, mkdirs, links, limit)

		seen := map[string]int{}
		for _, b := range batches {
			if sz := requestSize(b); sz > limit {
				t.Fatalf("trial %d: batch of %d bytes over limit %d", trial, sz, limit)
			}
			for _, f := range b.Files {
				seen[f.Path]++
			}
		}
		for _, f := range streamed {
			seen[f.Path]++
			if encodedSize(f) <= limit-100 {
				t.Fatalf("trial %d: %s (%d bytes) streamed although it fits", trial, f.Path, len(f.Data))
			}
		}
		for _, f := range files {
			if seen[f.Path] != 1 {
				t.Fatalf("trial %d: %s appears %d times", trial, f.Path, seen[f.Path])
			}
		}
		if len(seen) != len(files) {
			t.Fatalf("trial %d: %d files placed, want %d", trial, len(seen), len(files))
		}
		if len(batches) > 0 && (!slices.Equal(batches[0].Mkdirs, mkdirs) || len(batches[len(batches)-1].Symlinks) != 1) {
			t.Fatalf("trial %d: mkdirs or symlinks misplaced", trial)
		}
	}
}

func TestPack3000SmallFilesInFourBatches(t *testing.T) {
	var files []*sandboxv1.FileWrite
	for i := range 3000 {
		files = append(files, &sandboxv1.FileWrite{Path: fmt.Sprintf("src/d%02d/f%05d.txt", i%10, i), Data: make([]byte, 4096)})
	}
	batches, streamed := pack(files, []string{"src"}, nil, DefaultBatchBytes)
	if len(batches) != 4 || len(streamed) != 0 {
		t.Fatalf("%d batches, %d streamed; want 4 and 0", len(batches), len(streamed))
	}
}
