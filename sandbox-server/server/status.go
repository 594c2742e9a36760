package server

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/sandbox-server/envstate"
	"github.com/fusebox-dev/fusebox/sandbox-server/process"
	"github.com/fusebox-dev/fusebox/sandbox-server/watch"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"
)

// errInvalid marks request validation failures of this package.
var errInvalid = errors.New("invalid request")

// toStatus is the one place where errors of the sandbox server become gRPC status codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, workspace.ErrEscape):
		return codes.PermissionDenied
	case errors.Is(err, workspace.ErrLimit), errors.Is(err, process.ErrLimit), errors.Is(err, watch.ErrLimit):
		return codes.ResourceExhausted
	case errors.Is(err, process.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, process.ErrFutureOffset):
		return codes.OutOfRange
	case errors.Is(err, process.ErrExited), errors.Is(err, process.ErrStdinClosed),
		errors.Is(err, process.ErrNoTerminal), errors.Is(err, process.ErrKeyReused):
		return codes.FailedPrecondition
	case errors.Is(err, errInvalid),
		errors.Is(err, workspace.ErrInvalidPath),
		errors.Is(err, workspace.ErrInvalidArgument),
		errors.Is(err, envstate.ErrDuplicateOrder),
		errors.Is(err, process.ErrInvalid),
		errors.Is(err, watch.ErrInvalid),
		errors.Is(err, tlspin.ErrBadKey),
		errors.Is(err, syscall.ENAMETOOLONG):
		return codes.InvalidArgument
	// Before fs.ErrExist: syscall.Errno counts ENOTEMPTY as "exists".
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY),
		errors.Is(err, errNoShell):
		return codes.FailedPrecondition
	case errors.Is(err, fs.ErrNotExist):
		return codes.NotFound
	case errors.Is(err, fs.ErrExist):
		return codes.AlreadyExists
	case errors.Is(err, fs.ErrPermission):
		return codes.PermissionDenied
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENOMEM):
		return codes.ResourceExhausted
	default:
		return codes.Internal
	}
}
