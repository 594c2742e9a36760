package client

import (
	"path"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/fusebox-dev/fusebox/internal/binpack"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// fileOverhead bounds the bytes a FileWrite adds to a batch beyond its path and data: the
// field tags, lengths and mode, and the repeated-field wrapper.
const fileOverhead = 24

// encodedSize is the bytes f takes inside a WriteFilesRequest.
func encodedSize(f *sandboxv1.FileWrite) int {
	return len(f.GetPath()) + len(f.GetData()) + fileOverhead
}

// pack bin-packs files into requests whose encoded size stays within limit (package binpack:
// first fit over the files in decreasing size). Files that cannot fit in any batch on their
// own are returned as streamed. mkdirs go into the first request and symlinks into the last;
// every file appears exactly once.
func pack(files []*sandboxv1.FileWrite, mkdirs []string, symlinks []*sandboxv1.SymlinkSpec, limit int) (batches []*sandboxv1.WriteFilesRequest, streamed []*sandboxv1.FileWrite) {
	fixed := 0
	for _, d := range mkdirs {
		fixed += len(d) + 8
	}
	for _, l := range symlinks {
		fixed += len(l.GetPath()) + len(l.GetTarget()) + 16
	}
	bins, streamed := binpack.FirstFitDecreasing(files, func(f *sandboxv1.FileWrite) int64 { return int64(encodedSize(f)) },
		binpack.Bins{Capacity: int64(limit), Reserved: int64(fixed)})
	for _, b := range bins {
		batches = append(batches, &sandboxv1.WriteFilesRequest{Files: b})
	}
	if len(batches) == 0 && (len(mkdirs) > 0 || len(symlinks) > 0) {
		batches = append(batches, &sandboxv1.WriteFilesRequest{})
	}
	if len(batches) > 0 {
		batches[0].Mkdirs = mkdirs
		batches[len(batches)-1].Symlinks = symlinks
	}
	return batches, streamed
}

// requestSize is the exact encoded size of a batch, for tests and assertions.
func requestSize(r *sandboxv1.WriteFilesRequest) int { return proto.Size(r) }

// PruneMkdirs drops every directory that another directory in the list implies (a parent of
// it) and duplicates: [a/b/c, a/b/d, a/b] becomes [a/b/c, a/b/d]. Paths are cleaned first; the
// result is sorted.
func PruneMkdirs(dirs []string) []string {
	clean := make([]string, 0, len(dirs))
	for _, d := range dirs {
		c := path.Clean(d)
		if c == "." || c == "/" {
			continue
		}
		clean = append(clean, c)
	}
	slices.Sort(clean)
	clean = slices.Compact(clean)
	// After sorting, any descendant of d sorts after d, and the first entry after d that
	// extends it with a "/" (if any) appears before anything unrelated that could separate
	// them only if it shares the prefix: check the next entries that start with d.
	out := clean[:0]
	for i, d := range clean {
		implied := false
		for _, e := range clean[i+1:] {
			if !strings.HasPrefix(e, d) {
				break
			}
			if e[len(d)] == '/' {
				implied = true
				break
			}
		}
		if !implied {
			out = append(out, d)
		}
	}
	return out
}
