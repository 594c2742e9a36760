package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestParseReference(t *testing.T) {
	for _, tc := range []struct {
		ref, host, path, err string
	}{
		{ref: "127.0.0.1:5000/fusebox", host: "127.0.0.1:5000", path: "fusebox"},
		{ref: "localhost/a/b/", host: "localhost", path: "a/b"},
		{ref: "127.0.0.1:5000", err: "no repository path"},
		{ref: "127.0.0.1:5000/", err: "no repository path"},
		{ref: "https://127.0.0.1:5000/fusebox", err: "without https://"},
		{ref: "127.0.0.1:5000/fusebox:v1", err: "no tag or digest"},
		{ref: "127.0.0.1:5000/Fusebox", err: "bad registry reference"},
	} {
		host, path, err := ParseReference(tc.ref)
		if tc.err != "" {
			if !errors.Is(err, ErrBadReference) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want %q", tc.ref, err, tc.err)
			}
			continue
		}
		if err != nil || host != tc.host || path != tc.path {
			t.Errorf("%q: %q %q %v", tc.ref, host, path, err)
		}
	}
}

func TestInsecureOnlyOnLoopback(t *testing.T) {
	for ref, ok := range map[string]bool{
		"127.0.0.1:5000/f": true, "localhost:5000/f": true, "[::1]:5000/f": true,
		"10.0.0.5:5000/f": false, "registry.invalid/f": false,
	} {
		_, err := Open(context.Background(), ref, Options{Insecure: true})
		if ok != (err == nil) || (!ok && !errors.Is(err, ErrInsecure)) {
			t.Errorf("--insecure %s: %v", ref, err)
		}
	}
}
