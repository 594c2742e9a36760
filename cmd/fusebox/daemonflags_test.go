package main

import "testing"

// TestDaemonFlagDefaults: fusebox local up and fusebox manager take the same daemon flags and
// differ only in the defaults daemonDefaults names.
func TestDaemonFlagDefaults(t *testing.T) {
	local, service := localUpCmd().Flags(), managerCmd().Flags()
	for _, c := range []struct{ flag, local, service string }{
		{"listen", defaultManager, "tcp://0.0.0.0:9090"},
		{"metrics-listen", "", "0.0.0.0:9464"},
		{"allocator", "runsc", "kube"},
		{"estimator", "fixed", "ewma"},
		{"pool-max", "16", "32"},
		{"pool-size", "2", "2"},
		{"state-dir", "/var/lib/fusebox", "/var/lib/fusebox"},
		{"pool-ping", DefaultPoolPing.String(), DefaultPoolPing.String()},
		{"keep-sandboxes-awake", "true", "true"},
		{"insecure-process-runtime", "false", "false"},
	} {
		l, s := local.Lookup(c.flag), service.Lookup(c.flag)
		if l == nil || s == nil {
			t.Errorf("--%s: local up has it %v, manager %v", c.flag, l != nil, s != nil)
			continue
		}
		if l.DefValue != c.local || s.DefValue != c.service {
			t.Errorf("--%s defaults: local up %q, manager %q; want %q, %q", c.flag, l.DefValue, s.DefValue, c.local, c.service)
		}
	}
}
