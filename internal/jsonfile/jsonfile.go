// Package jsonfile reads and writes small JSON records (unit records, lease annotations)
// beside the local allocators' bundles. Writes are atomic: temp file, then rename.
package jsonfile

import (
	"encoding/json"
	"fmt"
	"os"
)

// Write stores v as JSON at path, replacing it atomically (mode 0600).
func Write(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
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
