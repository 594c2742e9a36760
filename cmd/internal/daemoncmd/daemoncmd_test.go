package daemoncmd

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/manager/daemon"
)

// TestFlagDefaults: fusebox local up and fusebox-manager take the same daemon flags and
// differ only in the defaults Defaults names.
func TestFlagDefaults(t *testing.T) {
	local := pflag.NewFlagSet("local up", pflag.ContinueOnError)
	Flags(local, &daemon.Config{}, Local)
	service := ServiceCommand("fusebox-manager").Flags()
	for _, c := range []struct{ flag, local, service string }{
		{"listen", DefaultManager, "tcp://0.0.0.0:9090"},
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
			t.Errorf("--%s: local up has it %v, fusebox-manager %v", c.flag, l != nil, s != nil)
			continue
		}
		if l.DefValue != c.local || s.DefValue != c.service {
			t.Errorf("--%s defaults: local up %q, fusebox-manager %q; want %q, %q", c.flag, l.DefValue, s.DefValue, c.local, c.service)
		}
	}
}

// TestServiceFlags: fusebox-manager takes the flags the manager component passes (its
// container's Args, components/manager) and that fusebox manager took before it, with
// values of their types.
func TestServiceFlags(t *testing.T) {
	args := []string{
		"--listen=tcp://0.0.0.0:9090", "--metrics-listen=0.0.0.0:9464", "--allocator=kube",
		"--sandbox-namespace=fusebox-sandboxes", "--manager-namespace=fusebox", "--identity=manager-0",
		"--sandbox-image=registry.example/fusebox/sandbox@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"--sandbox-template=/etc/fusebox/sandbox-template.yaml",
		"--agent-selector=fusebox.dev/agent=true", "--manager-selector=app.kubernetes.io/name=fusebox-manager",
		"--network-policy=cilium", "--agent-namespaces=agents,ci", "--agent-cidrs=10.0.0.0/8",
		"--image-pull-secrets=regcred", "--leader-elect=true", "--estimator=ewma", "--pool-size=2", "--pool-max=32",
		"--kubeconfig=/k", "--kube-api-qps=50", "--kube-api-burst=100", "--insecure-process-runtime=false",
		"--state-dir=/var/lib/fusebox", "--runsc=/r", "--sandbox-binary=/s", "--lease-ttl=10m",
		"--max-lease-ttl=24h", "--pool-ping=1s", "--keep-sandboxes-awake=true", "-v",
	}
	cmd := ServiceCommand("fusebox-manager")
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("parsing the manager component's flags: %v", err)
	}
	if err := cmd.Args(cmd, cmd.Flags().Args()); err != nil {
		t.Errorf("arguments after the flags: %v", err)
	}
	if err := ServiceCommand("fusebox-manager").Args(cmd, []string{"manager"}); err == nil {
		t.Error("fusebox-manager accepted a positional argument (a subcommand name): want an error")
	}
}
