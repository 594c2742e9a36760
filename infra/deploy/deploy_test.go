package deploy

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFileBackendDir(t *testing.T) {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Skip("no home directory")
	}
	for _, tc := range []struct {
		backend string
		want    string
		ok      bool
	}{
		{"file:///var/lib/fusebox/state", "/var/lib/fusebox/state", true},
		{"file:///var/lib/fusebox/state/", "/var/lib/fusebox/state", true},
		{"file://~/state", filepath.Join(home, "state"), true},
		{"file://~", home, true},
		{"file://state", "state", true},
		{"file:///tmp/s?no_tmp_dir=true", "/tmp/s", true},
		{"file://", "", false},
		{"s3://bucket/state", "", false},
		{"https://api.pulumi.com", "", false},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			got, ok := fileBackendDir(tc.backend)
			if got != tc.want || ok != tc.ok {
				t.Errorf("fileBackendDir(%q) = %q, %v; want %q, %v", tc.backend, got, ok, tc.want, tc.ok)
			}
		})
	}
}
