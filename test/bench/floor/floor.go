// Package floor measures the physical floor of materialising files inside a sandbox: a plain
// loop of open, write, close in the sandbox itself, with no RPC, no atomic rename and no
// validation. The data plane's WriteFiles figure is judged against it; fusebox-bench
// dataplane runs it there as the fusebox-floor helper.
package floor

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// WriteFiles writes n files of size bytes under dir (10 subdirectories, as a source tree
// would have) and returns the time the writes took, directory creation included.
func WriteFiles(dir string, n, size int) (time.Duration, error) {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	start := time.Now()
	for d := range 10 {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("d%02d", d)), 0o755); err != nil {
			return 0, err
		}
	}
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%02d/f%05d.txt", i%10, i))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}
