package client

import (
	"cmp"
	"path"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// fileOverhead bounds the bytes a FileWrite adds to a batch beyond its path and data: the
// field tags, lengths and mode, and the repeated-field wrapper.
const fileOverhead = 24

// encodedSize is the bytes f takes inside a WriteFilesRequest.
func encodedSize(f *sandboxv1.FileWrite) int {
	return len(f.GetPath()) + len(f.GetData()) + fileOverhead
}

// pack bin-packs files into requests whose encoded size stays within limit, using first fit
// over the files in decreasing size (which keeps the batch count near the minimum). Files
// that cannot fit in any batch on their own are returned as streamed. mkdirs go into the first
// request and symlinks into the last; every file appears exactly once.
func pack(files []*sandboxv1.FileWrite, mkdirs []string, symlinks []*sandboxv1.SymlinkSpec, limit int) (batches []*sandboxv1.WriteFilesRequest, streamed []*sandboxv1.FileWrite) {
	type bin struct {
		req  *sandboxv1.WriteFilesRequest
		size int
	}
	var bins []*bin
	fixed := 0
	for _, d := range mkdirs {
		fixed += len(d) + 8
	}
	for _, l := range symlinks {
		fixed += len(l.GetPath()) + len(l.GetTarget()) + 16
	}
	order := slices.Clone(files)
	slices.SortStableFunc(order, func(a, b *sandboxv1.FileWrite) int {
		return cmp.Compare(encodedSize(b), encodedSize(a))
	})
	for _, f := range order {
		sz := encodedSize(f)
		if sz > limit-fixed {
			streamed = append(streamed, f)
			continue
		}
		placed := false
		for _, b := range bins {
			if b.size+sz <= limit {
				b.req.Files = append(b.req.Files, f)
				b.size += sz
				placed = true
				break
			}
		}
		if !placed {
			bins = append(bins, &bin{req: &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{f}}, size: sz + fixed*btoi(len(bins) == 0)})
		}
	}
	if len(bins) == 0 && (len(mkdirs) > 0 || len(symlinks) > 0) {
		bins = append(bins, &bin{req: &sandboxv1.WriteFilesRequest{}})
	}
	for _, b := range bins {
		batches = append(batches, b.req)
	}
	if len(batches) > 0 {
		batches[0].Mkdirs = mkdirs
		batches[len(batches)-1].Symlinks = symlinks
	}
	return batches, streamed
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
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
