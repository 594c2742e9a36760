package daemoncmd

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
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
		// The API's security: the same flags, unset, in both (a TCP listener refuses to start
		// without a certificate and an audience; see manager/daemon).
		{"listen-group", "", ""},
		{"operator-uids", "", ""},
		{"tls-cert-file", "", ""},
		{"tls-key-file", "", ""},
		{"tls-secret", "", ""},
		{"tls-secret-create", "false", "false"},
		{"tls-dns-names", "[]", "[]"},
		{"ca-configmap", "", ""},
		{"token-audience", "", ""},
		{"token-cache-ttl", auth.DefaultCacheTTL.String(), auth.DefaultCacheTTL.String()},
		{"auth-policy", "", ""},
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
		"--network-policy=cilium", "--cluster-dns=nodelocaldns", "--agent-namespaces=agents,ci", "--agent-cidrs=10.0.0.0/8",
		"--image-pull-secrets=regcred", "--deployment=fusebox-manager", "--leader-elect=true", "--estimator=ewma", "--pool-size=2", "--pool-max=32",
		"--kubeconfig=/k", "--kube-api-qps=50", "--kube-api-burst=100", "--insecure-process-runtime=false",
		"--state-dir=/var/lib/fusebox", "--runsc=/r", "--sandbox-binary=/s", "--lease-ttl=10m",
		"--max-lease-ttl=24h", "--pool-ping=1s", "--keep-sandboxes-awake=true", "-v",
		"--tls-secret=fusebox-manager-tls", "--tls-secret-create=true",
		"--tls-dns-names=fusebox-manager,fusebox-manager.fusebox,fusebox-manager.fusebox.svc,fusebox-manager.fusebox.svc.cluster.local",
		"--ca-configmap=fusebox-manager-ca", "--token-audience=fusebox-manager",
		"--auth-policy=/etc/fusebox/policy/policy.yaml",
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

// TestLimitFlags: the sandbox limit flags fill Config.Limits, default to
// runscalloc.DefaultLimits, and a malformed value is refused naming its flag.
func TestLimitFlags(t *testing.T) {
	parse := func(args ...string) (daemon.Config, error) {
		f := pflag.NewFlagSet("local up", pflag.ContinueOnError)
		f.SetOutput(io.Discard)
		var c daemon.Config
		Flags(f, &c, Local)
		return c, f.Parse(args)
	}
	c, err := parse()
	if err != nil || c.Limits != runscalloc.DefaultLimits {
		t.Fatalf("defaults: %+v, %v; want %+v", c.Limits, err, runscalloc.DefaultLimits)
	}
	if _, err := c.Limits.Template(); err != nil {
		t.Fatalf("the default flags' limits are refused: %v", err)
	}
	c, err = parse("--sandbox-cpus=2", "--sandbox-cpu-quota=1.5", "--sandbox-memory=2Gi", "--sandbox-pids=1000", "--sandbox-workspace=768Mi")
	want := runscalloc.Limits{CPUs: 2, CPUQuota: 1.5, MemoryBytes: 2 << 30, Processes: 1000, WorkspaceBytes: 768 << 20}
	if err != nil || c.Limits != want {
		t.Fatalf("parsed %+v, %v; want %+v", c.Limits, err, want)
	}
	for _, tc := range []struct{ arg, flag string }{
		{"--sandbox-memory=lots", "sandbox-memory"},
		{"--sandbox-memory=-1Gi", "sandbox-memory"},
		{"--sandbox-memory=0.5", "sandbox-memory"},
		{"--sandbox-workspace=12parsecs", "sandbox-workspace"},
		{"--sandbox-cpus=many", "sandbox-cpus"},
		{"--sandbox-pids=1.5", "sandbox-pids"},
	} {
		if _, err := parse(tc.arg); err == nil || !strings.Contains(err.Error(), "--"+tc.flag) {
			t.Errorf("%s: %v, want an error naming --%s", tc.arg, err, tc.flag)
		}
	}
	// Well-formed but out of bounds: refused when the manager builds the template, naming the flag.
	c, err = parse("--sandbox-memory=1Gi", "--sandbox-workspace=1Gi")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Limits.Template(); err == nil || !strings.Contains(err.Error(), "--sandbox-workspace") {
		t.Errorf("a workspace as large as the memory: %v, want an error naming --sandbox-workspace", err)
	}
	if f := ServiceCommand("fusebox-manager").Flags().Lookup("sandbox-memory"); f == nil || f.DefValue != "1Gi" {
		t.Errorf("fusebox-manager's --sandbox-memory: %+v, want the flag with default 1Gi", f)
	}
}

// TestAuthFlags: the API's security flags fill daemon.AuthConfig, in fusebox local up and
// fusebox-manager alike, and a bad --operator-uids value is refused naming it.
func TestAuthFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func(*daemon.Config) *pflag.FlagSet
	}{
		{"local up", func(cfg *daemon.Config) *pflag.FlagSet {
			f := pflag.NewFlagSet("local up", pflag.ContinueOnError)
			Flags(f, cfg, Local)
			return f
		}},
		{"fusebox-manager", func(cfg *daemon.Config) *pflag.FlagSet {
			f := pflag.NewFlagSet("fusebox-manager", pflag.ContinueOnError)
			Flags(f, cfg, Service)
			return f
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cfg daemon.Config
			f := c.f(&cfg)
			err := f.Parse([]string{"--listen-group=fusebox", "--operator-uids=1000, 1001", "--tls-cert-file=/c", "--tls-key-file=/k",
				"--tls-dns-names=a,b", "--ca-configmap=ca", "--token-audience=aud", "--token-cache-ttl=30s", "--auth-policy=/p"})
			if err != nil {
				t.Fatal(err)
			}
			a := cfg.Auth
			if a.ListenGroup != "fusebox" || len(a.OperatorUIDs) != 2 || a.OperatorUIDs[0] != 1000 || a.OperatorUIDs[1] != 1001 ||
				a.TLSCertFile != "/c" || a.TLSKeyFile != "/k" || len(a.TLSDNSNames) != 2 || a.CAConfigMap != "ca" ||
				a.TokenAudience != "aud" || a.TokenCacheTTL.String() != "30s" || a.PolicyFile != "/p" {
				t.Errorf("AuthConfig = %+v", a)
			}
			err = c.f(&daemon.Config{}).Parse([]string{"--operator-uids=1000,alice"})
			if err == nil || !strings.Contains(err.Error(), "operator-uids") || !strings.Contains(err.Error(), `"alice" is not a user id`) {
				t.Errorf("--operator-uids=1000,alice: %v; want an error naming the flag and the value", err)
			}
		})
	}
}
