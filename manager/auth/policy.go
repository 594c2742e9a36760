package auth

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/manager/egress"
)

// PolicyFile is the authorisation policy as written (YAML or JSON):
//
//	rules:
//	- namespaces: [agents]                  # every ServiceAccount of these namespaces
//	  serviceAccounts: [ci/runner]          # and these ("namespace/name")
//	  templates: [default]                  # empty or absent: every template
//	  egress: ["pypi.org:443", "*.pythonhosted.org:443", "10.20.0.0/16:5432"]
//	operators: [fusebox/ops]                # see every tenant's sandboxes in List
//
// A caller may allocate when some rule names it or its namespace. Rules add up: the
// templates and the egress ceiling of every rule naming the caller are its own. A rule
// without egress allows allocations without egress only. Egress entries are those of
// egress.Ceiling: "host:port", "*.domain:port", addresses and CIDR blocks with a port.
type PolicyFile struct {
	Rules     []RuleFile `json:"rules"`
	Operators []string   `json:"operators,omitempty"`
}

// RuleFile is one rule of a PolicyFile.
type RuleFile struct {
	Namespaces      []string `json:"namespaces,omitempty"`
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	Templates       []string `json:"templates,omitempty"`
	Egress          []string `json:"egress,omitempty"`
}

// Policy is a parsed, checked authorisation policy. It is immutable. The zero Policy allows
// no ServiceAccount anything; so does a nil *Policy.
type Policy struct {
	rules     []rule
	operators []string
}

type rule struct {
	namespaces, accounts []string // accounts as "namespace/name"
	templates            []string // empty: all
	ceiling              egress.Ceiling
}

// LoadPolicy reads and parses the policy file at path.
func LoadPolicy(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the authorisation policy: %w", err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("authorisation policy %s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy parses a PolicyFile (YAML or JSON; unknown keys are errors naming them).
func ParsePolicy(data []byte) (*Policy, error) {
	var f PolicyFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, err
	}
	return NewPolicy(f)
}

// NewPolicy checks f and returns its Policy. Every error names the key at fault.
func NewPolicy(f PolicyFile) (*Policy, error) {
	p := &Policy{}
	for i, rf := range f.Rules {
		key := fmt.Sprintf("rules[%d]", i)
		if len(rf.Namespaces)+len(rf.ServiceAccounts) == 0 {
			return nil, fmt.Errorf("%s: names no namespaces and no serviceAccounts", key)
		}
		for j, ns := range rf.Namespaces {
			if ns == "" || strings.ContainsAny(ns, "/: ") {
				return nil, fmt.Errorf("%s.namespaces[%d]: %q is not a namespace name", key, j, ns)
			}
		}
		for j, sa := range rf.ServiceAccounts {
			if err := checkAccount(sa); err != nil {
				return nil, fmt.Errorf("%s.serviceAccounts[%d]: %w", key, j, err)
			}
		}
		for j, t := range rf.Templates {
			if t == "" {
				return nil, fmt.Errorf("%s.templates[%d]: empty template name", key, j)
			}
		}
		c, err := egress.ParseCeiling(rf.Egress)
		if err != nil {
			return nil, fmt.Errorf("%s.egress: %w", key, err)
		}
		p.rules = append(p.rules, rule{namespaces: slices.Clone(rf.Namespaces), accounts: slices.Clone(rf.ServiceAccounts),
			templates: slices.Clone(rf.Templates), ceiling: c})
	}
	for j, sa := range f.Operators {
		if err := checkAccount(sa); err != nil {
			return nil, fmt.Errorf("operators[%d]: %w", j, err)
		}
	}
	p.operators = slices.Clone(f.Operators)
	return p, nil
}

func checkAccount(sa string) error {
	ns, name, ok := strings.Cut(sa, "/")
	if !ok || ns == "" || name == "" || strings.ContainsAny(name, "/: ") || strings.ContainsAny(ns, ": ") {
		return fmt.Errorf("%q: want namespace/name", sa)
	}
	return nil
}

// Operators returns the ServiceAccounts ("namespace/name") that see every tenant's sandboxes.
func (p *Policy) Operators() []string {
	if p == nil {
		return nil
	}
	return slices.Clone(p.operators)
}

// Grant is what the policy allows one caller: the templates (nil: all) and the egress ceiling.
type Grant struct {
	Templates []string
	Ceiling   egress.Ceiling
}

// grant returns the union of the rules naming id; ok is false when none does.
func (p *Policy) grant(id Identity) (g Grant, ok bool) {
	if p == nil {
		return Grant{}, false
	}
	all := false
	for _, r := range p.rules {
		if !slices.Contains(r.namespaces, id.Namespace) && !slices.Contains(r.accounts, id.Namespace+"/"+id.ServiceAccount) {
			continue
		}
		ok = true
		if len(r.templates) == 0 {
			all = true
		}
		for _, t := range r.templates {
			if !slices.Contains(g.Templates, t) {
				g.Templates = append(g.Templates, t)
			}
		}
		g.Ceiling = g.Ceiling.Union(r.ceiling)
	}
	if all {
		g.Templates = nil
	}
	return g, ok
}

// Authorize reports whether id may allocate a sandbox of template with the allowlist allow.
// Local callers are not subject to the policy: the socket's file permissions decide who they
// are. Errors wrap ErrDenied and say what is outside the grant: the template, or each egress
// destination outside the ceiling.
func (p *Policy) Authorize(id Identity, template string, allow egress.Allowlist) error {
	if id.Local() {
		return nil
	}
	g, ok := p.grant(id)
	if !ok {
		return fmt.Errorf("%w: %s may not allocate sandboxes: no rule of the manager's authorisation policy names it or its namespace %q",
			ErrDenied, id, id.Namespace)
	}
	if g.Templates != nil && !slices.Contains(g.Templates, template) {
		return fmt.Errorf("%w: %s may not use template %q (allowed: %s)", ErrDenied, id, template, strings.Join(g.Templates, ", "))
	}
	if out := g.Ceiling.Outside(allow); len(out) > 0 {
		what := "destination " + out[0] + " is"
		if len(out) > 1 {
			what = "destinations " + strings.Join(out, ", ") + " are"
		}
		return fmt.Errorf("%w: egress %s outside the ceiling of %s (ceiling: %s)", ErrDenied, what, id, g.Ceiling)
	}
	return nil
}
