package workspace

import (
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
)

// handle is an open file: a raw descriptor on Linux (dirhandle_linux.go) or an *os.File.
type handle interface {
	io.Reader
	io.ReaderAt
	io.Writer
	Close() error
	chmod(m uint32) error
	stat() (size int64, mode fs.FileMode, err error)
}

// errFollow is returned by dirHandle.openRead for a symlink, which must be opened through the
// root so that the link is followed with the root's checks.
var errFollow = errors.New("symlink: open through the root")

// errSkip is returned by dirHandle.openSubdir for a name that is no longer a directory (removed,
// or swapped for a symlink or a file since it was listed): a walk skips it.
var errSkip = errors.New("not a directory any more: skip")

// tempName returns a fresh temp file name. Uniqueness comes from O_EXCL; the randomness (the
// runtime's per-thread ChaCha8, no system call) only makes collisions rare.
func tempName() string {
	return tempPrefix + strconv.FormatUint(rand.Uint64(), 36)
}

// splitRel splits a clean relative path other than "." into its directory ("." for the root)
// and final name.
func splitRel(rel string) (dir, name string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ".", rel
	}
	return rel[:i], rel[i+1:]
}

// dirCache opens each directory of one batch once, so that every file of the batch costs only
// single-component system calls.
type dirCache struct {
	root *rootDir
	mu   sync.Mutex            // guards dirs
	dirs map[string]*cachedDir // by relative path
}

type cachedDir struct {
	once sync.Once
	d    *dirHandle
	err  error
}

func newDirCache(root *rootDir) *dirCache {
	return &dirCache{root: root, dirs: make(map[string]*cachedDir)}
}

// get returns the handle of directory rel. With create, a missing directory is created
// (MkdirAll) and opened again: the common case, an existing directory, costs one open.
func (c *dirCache) get(rel string, create bool) (*dirHandle, error) {
	c.mu.Lock()
	e := c.dirs[rel]
	if e == nil {
		e = &cachedDir{}
		c.dirs[rel] = e
	}
	c.mu.Unlock()
	e.once.Do(func() {
		e.d, e.err = openParent(c.root, rel, create)
	})
	return e.d, e.err
}

func (c *dirCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.dirs {
		if e.d != nil {
			e.d.close()
		}
	}
	c.dirs = nil
}

// openParent opens directory rel, creating it and its parents first if create is set and it
// does not exist.
func openParent(root *rootDir, rel string, create bool) (*dirHandle, error) {
	d, err := root.openDir(rel)
	if err == nil || !create || !errors.Is(err, fs.ErrNotExist) {
		return d, err
	}
	if err := root.mkdirAll(rel, defaultDirMode); err != nil {
		return nil, err
	}
	return root.openDir(rel)
}
