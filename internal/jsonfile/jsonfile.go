// Package jsonfile reads and writes small JSON records (unit records, lease annotations)
// beside the local allocators' bundles. Writes are atomic: temp file, then rename.
package jsonfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Write stores v as JSON at path, replacing it atomically (mode 0600): it writes path's
// temporary file (path + ".tmp", reused if it exists, see Prepare) and renames it to path.
func Write(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := writeTemp(tmp, b); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// writeTemp writes b into the file at tmp, created if it does not exist. It does not open
// with O_TRUNC: ext4 takes a file truncated to nothing for one being replaced in place and
// writes it out on close (auto_da_alloc), a synchronous block-device submission; shrinking a
// longer leftover (a crash between write and rename) after the write does the same, rarely.
func writeTemp(tmp string, b []byte) error {
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Truncate(int64(len(b)))
	}
	return errors.Join(err, f.Close())
}

// Prepare creates path's temporary file, empty, ahead of a Write to path that should be quick:
// that Write then fills a file that exists instead of creating one. Creating a file is the dear
// part of a small write where many are created and deleted: ext4 without a journal skips every
// inode deleted in the last minute or more when it looks for a free one (BenchmarkWrite
// compares a fresh and a prepared write).
func Prepare(path string) error {
	if err := writeTemp(path+".tmp", nil); err != nil {
		return fmt.Errorf("preparing %s: %w", path, err)
	}
	return nil
}

// Read decodes the JSON at path into v.
func Read(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
