// Package cmdenv checks the environment variables and working directory an allocation gives
// its sandbox's commands: the one validation the manager applies before it spends a unit on
// an allocation, and the sandbox server again when sFuse delivers them.
package cmdenv

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// Bounds of what Check accepts.
const (
	MaxVars  = 256
	MaxBytes = 64 << 10 // names and values together
	MaxCwd   = 4096
)

// ErrInvalid is wrapped by every error of Check.
var ErrInvalid = errors.New("invalid command environment")

// Check checks env (names of letters, digits and '_', not starting with a digit; values
// without NUL bytes; within MaxVars and MaxBytes) and cwd (empty, or a clean path, absolute
// or relative to the workspace, that does not climb out of it with "..").
func Check(env map[string]string, cwd string) error {
	if len(env) > MaxVars {
		return fmt.Errorf("%w: %d environment variables, at most %d", ErrInvalid, len(env), MaxVars)
	}
	size := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !ValidName(k) {
			return fmt.Errorf("%w: %q is not a variable name (letters, digits and '_', not starting with a digit)", ErrInvalid, k)
		}
		if strings.IndexByte(env[k], 0) >= 0 {
			return fmt.Errorf("%w: the value of %s holds a NUL byte", ErrInvalid, k)
		}
		size += len(k) + len(env[k])
	}
	if size > MaxBytes {
		return fmt.Errorf("%w: the environment holds %d bytes, at most %d", ErrInvalid, size, MaxBytes)
	}
	switch {
	case cwd == "":
	case len(cwd) > MaxCwd || strings.IndexByte(cwd, 0) >= 0:
		return fmt.Errorf("%w: working directory %.40q... is too long or holds a NUL byte", ErrInvalid, cwd)
	case path.Clean(cwd) != cwd:
		return fmt.Errorf("%w: working directory %q is not a clean path (want %q)", ErrInvalid, cwd, path.Clean(cwd))
	case !path.IsAbs(cwd) && (cwd == ".." || strings.HasPrefix(cwd, "../")):
		return fmt.Errorf("%w: working directory %q leaves the workspace: give an absolute path", ErrInvalid, cwd)
	}
	return nil
}

// ValidName reports whether k is a variable name: letters, digits and '_', not starting with a
// digit.
func ValidName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, c := range []byte(k) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
