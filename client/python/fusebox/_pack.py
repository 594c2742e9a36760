"""Bin-packing of file writes into batches, and mkdir pruning (the Go SDK's client/pack.go)."""

from __future__ import annotations

import posixpath
from typing import List, Sequence, Tuple

from ._proto.sandbox.v1 import sandbox_pb2

# The bytes a FileWrite adds to a batch beyond its path and data: field tags, lengths, mode
# and the repeated-field wrapper.
FILE_OVERHEAD = 24


def encoded_size(f: sandbox_pb2.FileWrite) -> int:
    """The bytes f takes inside a WriteFilesRequest, bounded from above."""
    return len(f.path.encode()) + len(f.data) + FILE_OVERHEAD


def pack(files: Sequence[sandbox_pb2.FileWrite], mkdirs: Sequence[str], symlinks: Sequence[sandbox_pb2.SymlinkSpec],
         limit: int) -> Tuple[List[sandbox_pb2.WriteFilesRequest], List[sandbox_pb2.FileWrite]]:
    """Packs files into requests whose encoded size stays within limit.

    First fit over the files in decreasing size keeps the batch count near the minimum. Files
    that cannot fit in a batch on their own are returned as streamed. mkdirs go into the first
    request and symlinks into the last; every file appears exactly once.
    """
    fixed = sum(len(d.encode()) + 8 for d in mkdirs) + sum(len(l.path.encode()) + len(l.target.encode()) + 16 for l in symlinks)
    bins: List[List] = []  # [files, size]
    streamed: List[sandbox_pb2.FileWrite] = []
    for f in sorted(files, key=encoded_size, reverse=True):  # sorted() is stable
        sz = encoded_size(f)
        if sz > limit - fixed:
            streamed.append(f)
            continue
        for b in bins:
            if b[1] + sz <= limit:
                b[0].append(f)
                b[1] += sz
                break
        else:
            bins.append([[f], sz + (fixed if not bins else 0)])
    if not bins and (mkdirs or symlinks):
        bins.append([[], 0])
    batches = [sandbox_pb2.WriteFilesRequest(files=b[0]) for b in bins]
    if batches:
        batches[0].mkdirs.extend(mkdirs)
        batches[-1].symlinks.extend(symlinks)
    return batches, streamed


def prune_mkdirs(dirs: Sequence[str]) -> List[str]:
    """Drops every directory another in the list implies, and duplicates.

    [a/b/c, a/b/d, a/b] becomes [a/b/c, a/b/d]. Paths are normalised first; the result is sorted.
    """
    clean = sorted({c for c in (posixpath.normpath(d) for d in dirs if d) if c not in (".", "/")})
    out = []
    for i, d in enumerate(clean):
        implied = False
        for e in clean[i + 1:]:
            if not e.startswith(d):
                break
            if e[len(d)] == "/":
                implied = True
                break
        if not implied:
            out.append(d)
    return out
