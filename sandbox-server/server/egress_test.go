package server

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// StartEgress runs only for an allocation with an egress allowlist, once, before the agent's
// first command, whose environment then holds the variables it returned; without an
// allowlist it never runs and commands get none. A failure refuses the InitializeTLS with the
// fuse intact.
func TestEgressStartsOnlyWithAnAllowlist(t *testing.T) {
	tests := []struct {
		name    string
		allow   []string
		fail    bool
		wantEnv string // the variable a command sees ("" unset)
	}{
		{name: "no allowlist", wantEnv: ""},
		{name: "allowlist", allow: []string{"127.0.0.1:8000"}, wantEnv: "http://127.0.0.1:3128"},
		{name: "start fails", allow: []string{"127.0.0.1:8000"}, fail: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var calls [][]string
			fail := tc.fail
			start := func(allow []string) (map[string]string, error) {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, slices.Clone(allow))
				if fail {
					fail = false
					return nil, errors.New("injected: address in use")
				}
				return map[string]string{"HTTP_PROXY": "http://127.0.0.1:3128", "PATH": "/not/this"}, nil
			}
			initAddr, dataAddr, _ := startInProcessWith(t, Options{IdleTTL: time.Minute, StartEgress: start})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			key, _ := client.NewKey()
			req := sfuse.Request{AgentKey: key.PublicKey(), Egress: tc.allow}
			res, err := sfuse.Initialize(ctx, initAddr, req)
			if tc.fail {
				if err == nil || !strings.Contains(err.Error(), "starting egress") {
					t.Fatalf("InitializeTLS with a failing StartEgress = %v, want its error", err)
				}
				// The fuse is intact: the next InitializeTLS succeeds.
				if res, err = sfuse.Initialize(ctx, initAddr, req); err != nil {
					t.Fatalf("InitializeTLS after a failed start: %v", err)
				}
				tc.wantEnv = "http://127.0.0.1:3128"
			} else if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			n := len(calls)
			if tc.allow == nil && n != 0 || tc.allow != nil && (n != 1+btoi(tc.fail) || !slices.Equal(calls[n-1], tc.allow)) {
				t.Errorf("StartEgress calls %q for allowlist %q", calls, tc.allow)
			}
			mu.Unlock()
			sb, err := client.Dial(dataAddr, res.SandboxKey, key)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			out, err := sb.Exec(ctx, client.Command{Script: `printf '%s|%s' "${HTTP_PROXY-unset}" "$PATH"`})
			if err != nil {
				t.Fatal(err)
			}
			proxy, path, _ := strings.Cut(string(out.Stdout), "|")
			if want := cmp(tc.wantEnv, "unset"); proxy != want {
				t.Errorf("HTTP_PROXY in the first command = %q, want %q", proxy, want)
			}
			if path == "/not/this" {
				t.Error("StartEgress's variables replaced the base environment's PATH")
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cmp returns s, or def when s is empty.
func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
