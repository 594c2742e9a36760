package runsc

import (
	"errors"
	"fmt"
)

// idDigits is the fixed number of decimal digits in every container id.
const idDigits = 12

// MaxIDNumber is the largest n that ID formats within the fixed width.
const MaxIDNumber uint64 = 999_999_999_999

// maxPrefixLen bounds the prefix so that ids stay short (runsc puts them in
// file names and socket names).
const maxPrefixLen = 16

// ErrInvalidID is returned (wrapped) by every Runtime method given an id that
// ValidID rejects; nothing is run in that case.
var ErrInvalidID = errors.New("invalid container id")

// ID returns the container id for sandbox number n under prefix, such as
// "fbx-000000000042" for ID("fbx", 42).
//
// The prefix must be 1-16 characters of [a-z0-9] starting with a letter, and
// n at most MaxIDNumber. ID does not panic on bad input: it returns an id that
// ValidID rejects, so that the first Runtime call fails with ErrInvalidID.
func ID(prefix string, n uint64) string {
	return fmt.Sprintf("%s-%0*d", prefix, idDigits, n)
}

// ValidID reports whether id has the form ID produces: a prefix of 1-16
// characters of [a-z0-9] starting with a letter, a dash, and exactly 12
// decimal digits.
//
// Because the prefix cannot contain a dash and the number has a fixed width,
// no valid id is a proper prefix of another valid id, so runsc's
// prefix matching can only ever resolve a valid id to itself.
func ValidID(id string) bool {
	return checkID(id) == nil
}

// checkID is ValidID with a reason, wrapping ErrInvalidID.
func checkID(id string) error {
	dash := len(id) - idDigits - 1
	if dash < 1 || id[dash] != '-' {
		return fmt.Errorf("%w %q: want <prefix>-<%d digits>", ErrInvalidID, id, idDigits)
	}
	prefix, digits := id[:dash], id[dash+1:]
	if len(prefix) > maxPrefixLen {
		return fmt.Errorf("%w %q: prefix longer than %d characters", ErrInvalidID, id, maxPrefixLen)
	}
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		switch {
		case c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return fmt.Errorf("%w %q: prefix must be [a-z][a-z0-9]*", ErrInvalidID, id)
		}
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return fmt.Errorf("%w %q: want <prefix>-<%d digits>", ErrInvalidID, id, idDigits)
		}
	}
	return nil
}
