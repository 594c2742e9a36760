package egress

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestCeilingOutside(t *testing.T) {
	ceiling := []string{"pypi.org:443", "*.pythonhosted.org:443", "192.0.2.10:80", "10.20.0.0/16:5432", "[2001:db8::/32]:443"}
	tests := []struct {
		req     []string
		outside []string
	}{
		{nil, nil},
		{[]string{"pypi.org:443"}, nil},
		{[]string{"PyPI.org.:443"}, nil},
		{[]string{"pypi.org:80"}, []string{"pypi.org:80"}},
		{[]string{"files.pythonhosted.org:443", "a.b.pythonhosted.org:443"}, nil},
		{[]string{"pythonhosted.org:443"}, []string{"pythonhosted.org:443"}},
		{[]string{"*.pythonhosted.org:443", "*.cdn.pythonhosted.org:443"}, nil},
		{[]string{"*.evilpythonhosted.org:443"}, []string{"*.evilpythonhosted.org:443"}},
		{[]string{"files.evilpythonhosted.org:443"}, []string{"files.evilpythonhosted.org:443"}},
		{[]string{"*.pypi.org:443"}, []string{"*.pypi.org:443"}},
		{[]string{"192.0.2.10:80"}, nil},
		{[]string{"192.0.2.11:80"}, []string{"192.0.2.11:80"}},
		{[]string{"10.20.3.4:5432", "10.21.0.1:5432", "10.20.3.4:5433"}, []string{"10.21.0.1:5432", "10.20.3.4:5433"}},
		{[]string{"[2001:db8::1]:443", "[2001:db9::1]:443"}, []string{"[2001:db9::1]:443"}},
		// A name is never inside a block of addresses, whatever it resolves to.
		{[]string{"db.internal:5432"}, []string{"db.internal:5432"}},
		{[]string{"evil.example:443", "pypi.org:443"}, []string{"evil.example:443"}},
	}
	c, err := ParseCeiling(ceiling)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.req, ","), func(t *testing.T) {
			a, err := ParseAllowlist(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Outside(a); !slices.Equal(got, tt.outside) {
				t.Errorf("Outside(%q) = %q, want %q", tt.req, got, tt.outside)
			}
		})
	}
}

func TestCeilingEmptyPermitsOnlyNoEgress(t *testing.T) {
	var c Ceiling
	if got := c.Outside(Allowlist{}); len(got) != 0 {
		t.Fatalf("empty allowlist outside the empty ceiling: %q", got)
	}
	a, _ := ParseAllowlist([]string{"example.com:443"})
	if got := c.Outside(a); !slices.Equal(got, []string{"example.com:443"}) {
		t.Fatalf("Outside = %q", got)
	}
	if c.String() != "nothing" {
		t.Fatalf("String() = %q", c.String())
	}
}

func TestCeilingUnionAndEntries(t *testing.T) {
	a, _ := ParseCeiling([]string{"a.example:443", "10.0.0.0/8:80"})
	b, _ := ParseCeiling([]string{"a.example:443", "*.b.example:443", "[fd00::/8]:443"})
	u := a.Union(b)
	want := []string{"a.example:443", "*.b.example:443", "10.0.0.0/8:80", "[fd00::/8]:443"}
	if got := u.Entries(); !slices.Equal(got, want) {
		t.Fatalf("Entries() = %q, want %q", got, want)
	}
	if len(a.Entries()) != 2 {
		t.Fatalf("Union changed its receiver: %q", a.Entries())
	}
}

func TestParseCeilingBad(t *testing.T) {
	for _, s := range []string{"", "10.0.0.0/8", "10.0.0.0/8:0", "10.0.0.1/8:443", "10.0.0.0/33:443", "2001:db8::/32:443",
		"[10.0.0.0/8]:443", "example.com", "*.com:443", "x/y:443"} {
		t.Run(s, func(t *testing.T) {
			_, err := ParseCeiling([]string{s})
			if !errors.Is(err, ErrBadEntry) || !strings.Contains(err.Error(), `"`+s+`"`) {
				t.Fatalf("ParseCeiling(%q) = %v, want ErrBadEntry quoting the entry", s, err)
			}
		})
	}
}
