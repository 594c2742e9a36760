"""Bin-packing of file writes into batches, and mkdir pruning (the Go SDK's client/pack.go)."""

from __future__ import annotations

import posixpath
from typing import List, NamedTuple, Sequence, Tuple, Union

from ._proto.sandbox.v1 import sandbox_pb2


class Pending(NamedTuple):
    """A file to write, not yet put into a message: a file too large for a batch is streamed
    from its bytes as they are, never copied into a FileWrite and out again (reading a
    message's bytes field copies it, and for a 256 MiB file those copies were most of the
    write's time)."""
    path: str
    data: bytes
    mode: int = 0


FileLike = Union[Pending, sandbox_pb2.FileWrite]

# The bytes a FileWrite adds to a batch beyond its path and data: field tags, lengths, mode
# and the repeated-field wrapper.
FILE_OVERHEAD = 24


def encoded_size(f: FileLike) -> int:
    """The bytes f takes inside a WriteFilesRequest, bounded from above (a FileWrite's own
    ByteSize, which does not copy its data)."""
    if isinstance(f, Pending):
        return len(f.path.encode()) + len(f.data) + FILE_OVERHEAD
    return f.ByteSize() + 6  # the repeated field's tag and length


def as_message(f: FileLike) -> sandbox_pb2.FileWrite:
    return sandbox_pb2.FileWrite(path=f.path, data=f.data, mode=f.mode) if isinstance(f, Pending) else f


def pack(files: Sequence[FileLike], mkdirs: Sequence[str], symlinks: Sequence[sandbox_pb2.SymlinkSpec],
         limit: int) -> Tuple[List[sandbox_pb2.WriteFilesRequest], List[FileLike]]:
    """Packs files into requests whose encoded size stays within limit.

    First fit over the files in decreasing size keeps the batch count near the minimum. Files
    that cannot fit in a batch on their own are returned as streamed. mkdirs go into the first
    request and symlinks into the last; every file appears exactly once.
    """
    fixed = sum(len(d.encode()) + 8 for d in mkdirs) + sum(len(l.path.encode()) + len(l.target.encode()) + 16 for l in symlinks)
    bins: List[List] = []  # [files, size]
    streamed: List[FileLike] = []
    for sz, f in sorted(((encoded_size(f), f) for f in files), key=lambda t: t[0], reverse=True):  # stable
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
    batches = [sandbox_pb2.WriteFilesRequest(files=[as_message(f) for f in b[0]]) for b in bins]
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
