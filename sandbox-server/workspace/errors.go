package workspace

import (
	"errors"
	"fmt"
)

// Errors returned by Workspace methods. The gRPC server maps them to status codes in one place:
//
//   - ErrInvalidArgument (and ErrInvalidPath, which wraps it): INVALID_ARGUMENT.
//   - ErrEscape: PERMISSION_DENIED.
//   - ErrLimit: RESOURCE_EXHAUSTED.
//   - errors.Is(err, fs.ErrNotExist): NOT_FOUND; errors.Is(err, fs.ErrExist): ALREADY_EXISTS.
//   - errors.Is(err, syscall.ENOTDIR), syscall.EISDIR, syscall.ENOTEMPTY: FAILED_PRECONDITION.
//   - context.Canceled, context.DeadlineExceeded: passed through unchanged (wrapped with %w).
//   - anything else: an I/O failure (INTERNAL).
//
// Checks are made in that order of precedence: an escape that also fails to exist is ErrEscape.
//
// Which method returns what, beyond the fs/syscall errors any method can return for the
// path it names:
//
//   - Resolve: ErrInvalidPath (empty, NUL byte, name > 255 bytes, path > 4096 bytes),
//     ErrEscape ("..", absolute path not under MountPath).
//   - WriteFiles: ErrInvalidPath, ErrEscape (also a symlink target leaving the workspace, or a
//     path running through a symlink that leaves it), ErrInvalidArgument (bad mode), ErrLimit
//     (a file over MaxFileBytes or a batch over MaxBatchBytes; checked before anything is
//     written). Invalid input anywhere in the batch rejects the whole batch untouched.
//   - WriteStream: as WriteFiles, plus ErrInvalidArgument (missing header, negative size, a
//     stream whose length differs from the header's size), ErrLimit (over MaxFileBytes), any
//     error returned by next, and ctx errors. On every error no file and no temp file is left.
//   - ReadPlan: ErrInvalidPath (also a bad glob), ErrEscape, ErrLimit (more than
//     MaxFindResults files planned). Missing paths are reported in the plan, not as errors.
//   - ReadFiles: ErrInvalidPath, ErrEscape, ErrLimit (over MaxBatchBytes or MaxFileBytes),
//     fs.ErrNotExist, syscall.EISDIR (a directory), ErrInvalidArgument (another non-regular
//     file).
//   - ReadStream: as ReadFiles without the batch limit, plus errors returned by send.
//   - Stat, List, Find: ErrInvalidPath (also a bad name glob), ErrEscape, fs.ErrNotExist,
//     syscall.ENOTDIR (List and Find of a non-directory).
//   - Mkdir: ErrInvalidPath, ErrEscape, ErrInvalidArgument (bad mode), fs.ErrExist (without
//     parents), syscall.ENOTDIR.
//   - Remove: ErrInvalidPath (also the workspace root itself), ErrEscape, fs.ErrNotExist
//     (unless missing_ok), syscall.ENOTEMPTY (a non-empty directory without recursive).
//   - Rename: ErrInvalidPath (also the root as source or destination), ErrEscape,
//     fs.ErrNotExist, fs.ErrExist (destination exists without overwrite), syscall.EISDIR,
//     syscall.ENOTDIR, syscall.ENOTEMPTY.
//   - Symlink: ErrInvalidPath, ErrEscape (also an absolute or escaping target), fs.ErrExist.
//   - Grep: ErrInvalidArgument (bad regexp), ErrInvalidPath (bad include/exclude glob),
//     ErrEscape, fs.ErrNotExist (an explicit path that does not exist).
var (
	// ErrInvalidArgument reports malformed input that is not a path: a bad mode, a bad regular
	// expression, a missing stream header, a size mismatch.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrInvalidPath reports a malformed path or glob. It wraps ErrInvalidArgument, so
	// errors.Is(err, ErrInvalidArgument) holds for both; map ErrInvalidArgument alone.
	ErrInvalidPath = fmt.Errorf("invalid path: %w", ErrInvalidArgument)
	// ErrEscape reports a path or symlink target that would leave the workspace.
	ErrEscape = errors.New("path escapes the workspace")
	// ErrLimit reports a request over one of the workspace's size or count limits.
	ErrLimit = errors.New("limit exceeded")
)

// wrap adds what was being done to err. It returns nil for a nil err. Escapes are tagged with
// ErrEscape where they are detected (root_linux.go, root_other.go).
func wrap(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %q: %w", op, p, err)
}

// isEscape reports whether err is ErrEscape.
func isEscape(err error) bool { return errors.Is(err, ErrEscape) }
