package auth

import (
	"errors"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/manager/egress"
)

const policyYAML = `
rules:
- namespaces: [agents]
  templates: [default]
  egress: ["pypi.org:443", "*.pythonhosted.org:443"]
- serviceAccounts: [ci/runner]
  egress: ["10.20.0.0/16:5432"]
- serviceAccounts: [agents/builder]
  templates: [big]
  egress: ["proxy.golang.org:443"]
operators: [fusebox/ops]
`

func TestPolicyAuthorize(t *testing.T) {
	p, err := ParsePolicy([]byte(policyYAML))
	if err != nil {
		t.Fatal(err)
	}
	coder, builder, runner := ServiceAccountIdentity("agents", "coder"), ServiceAccountIdentity("agents", "builder"), ServiceAccountIdentity("ci", "runner")
	tests := []struct {
		name     string
		id       Identity
		template string
		egress   []string
		msg      string // "" allowed
	}{
		{"namespace rule", coder, "default", []string{"pypi.org:443", "files.pythonhosted.org:443"}, ""},
		{"no egress", coder, "default", nil, ""},
		{"outside the ceiling", coder, "default", []string{"pypi.org:443", "evil.example:443"},
			`egress destination evil.example:443 is outside the ceiling of service account agents/coder (ceiling: pypi.org:443, *.pythonhosted.org:443)`},
		{"two outside", coder, "default", []string{"a.example:443", "pypi.org:80"}, "egress destinations a.example:443, pypi.org:80 are outside the ceiling"},
		{"template not allowed", coder, "big", nil, `service account agents/coder may not use template "big" (allowed: default)`},
		{"rules add up: templates", builder, "big", nil, ""},
		{"rules add up: ceilings", builder, "default", []string{"pypi.org:443", "proxy.golang.org:443"}, ""},
		{"account rule, every template", runner, "anything", []string{"10.20.1.2:5432"}, ""},
		{"account rule, name outside its block ceiling", runner, "default", []string{"db.example:5432"}, "egress destination db.example:5432 is outside"},
		{"outside the policy", ServiceAccountIdentity("other", "x"), "default", nil,
			`service account other/x may not allocate sandboxes: no rule of the manager's authorisation policy names it or its namespace "other"`},
		{"same name, other namespace", ServiceAccountIdentity("ci2", "runner"), "default", nil, "may not allocate"},
		{"local caller: file permissions decide", LocalIdentity(1000, false), "big", []string{"anything.example:443"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allow, err := egress.ParseAllowlist(tt.egress)
			if err != nil {
				t.Fatal(err)
			}
			err = p.Authorize(tt.id, tt.template, allow)
			if tt.msg == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want ErrDenied containing %q", err, tt.msg)
			}
		})
	}
	if ops := p.Operators(); len(ops) != 1 || ops[0] != "fusebox/ops" {
		t.Fatalf("Operators() = %q", ops)
	}
}

func TestNilPolicyDeniesServiceAccounts(t *testing.T) {
	var p *Policy
	if err := p.Authorize(ServiceAccountIdentity("a", "b"), "default", egress.Allowlist{}); !errors.Is(err, ErrDenied) {
		t.Fatalf("nil policy: %v", err)
	}
	if err := p.Authorize(LocalIdentity(0, true), "default", egress.Allowlist{}); err != nil {
		t.Fatalf("nil policy, local caller: %v", err)
	}
}

func TestParsePolicyBad(t *testing.T) {
	tests := []struct{ in, msg string }{
		{"rules:\n- templates: [default]\n", "rules[0]: names no namespaces and no serviceAccounts"},
		{"rules:\n- namespaces: [a]\n  egress: [\"pypi.org\"]\n", `rules[0].egress: malformed egress allowlist entry "pypi.org"`},
		{"rules:\n- namespaces: [a]\n- serviceAccounts: [coder]\n", `rules[1].serviceAccounts[0]: "coder": want namespace/name`},
		{"rules:\n- namespaces: [a/b]\n", `rules[0].namespaces[0]: "a/b" is not a namespace name`},
		{"rules:\n- namespace: [a]\n", `unknown field "namespace"`},
		{"operators: [ops]\n", `operators[0]: "ops": want namespace/name`},
		{"rules:\n- namespaces: [a]\n  templates: [\"\"]\n", "rules[0].templates[0]: empty template name"},
	}
	for _, tt := range tests {
		t.Run(tt.msg, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("ParsePolicy = %v, want an error containing %q", err, tt.msg)
			}
		})
	}
}
