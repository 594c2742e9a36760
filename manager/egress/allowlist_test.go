package egress

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseAllowlistGood(t *testing.T) {
	tests := []struct {
		in   []string
		want []string
	}{
		{nil, []string{}},
		{[]string{"api.github.com:443"}, []string{"api.github.com:443"}},
		{[]string{"API.GitHub.COM.:443"}, []string{"api.github.com:443"}},
		{[]string{"*.pypi.org:443"}, []string{"*.pypi.org:443"}},
		{[]string{"*.Files.PythonHosted.org.:443"}, []string{"*.files.pythonhosted.org:443"}},
		{[]string{"localhost:8080"}, []string{"localhost:8080"}},
		{[]string{"xn--bcher-kva.example:80"}, []string{"xn--bcher-kva.example:80"}},
		{[]string{"_svc.example.com:53"}, []string{"_svc.example.com:53"}},
		{[]string{"127.0.0.1:8080"}, []string{"127.0.0.1:8080"}},
		{[]string{"169.254.169.254:80"}, []string{"169.254.169.254:80"}},
		{[]string{"[::1]:443"}, []string{"[::1]:443"}},
		{[]string{"[2001:DB8::1]:65535"}, []string{"[2001:db8::1]:65535"}},
		{[]string{"[::ffff:10.0.0.1]:22"}, []string{"10.0.0.1:22"}},
		{[]string{"a.example:1", "A.example:1", "a.example.:1", "b.example:1"}, []string{"a.example:1", "b.example:1"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.in, ","), func(t *testing.T) {
			a, err := ParseAllowlist(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := a.Entries(); !slices.Equal(got, tt.want) {
				t.Errorf("Entries() = %q, want %q", got, tt.want)
			}
			if got, want := a.String(), strings.Join(tt.want, ", "); got != want {
				t.Errorf("String() = %q, want %q", got, want)
			}
		})
	}
}

func TestParseAllowlistBad(t *testing.T) {
	bad := []string{
		"",
		"example.com",
		"example.com:",
		":443",
		"example.com:0",
		"example.com:65536",
		"example.com:-1",
		"example.com:+443",
		"example.com:https",
		"example.com:*",
		"*:443",
		"*.:443",
		"*.com:443",
		"*.*.example.com:443",
		"a.*.example.com:443",
		"*example.com:443",
		"foo*.example.com:443",
		"https://example.com:443",
		"example.com:443/path",
		"example.com/path:443",
		"user@example.com:443",
		"example.com:443?q",
		" example.com:443",
		"exa mple.com:443",
		"example.com:443\n",
		"bücher.example:443",
		"-bad.example.com:443",
		"bad-.example.com:443",
		"a..b:443",
		".:443",
		"ex!ample.com:443",
		strings.Repeat("a", 64) + ".com:443",
		strings.Repeat("abcdefghi.", 26) + "com:443",
		"::1:443",
		"[::1]",
		"[127.0.0.1]:443",
		"[example.com]:443",
		"[fe80::1%eth0]:443",
		"1.2.3:443",
		"999.1.1.1:443",
		"0x7f.0.0.1:80",
	}
	for _, s := range bad {
		t.Run(s, func(t *testing.T) {
			_, err := ParseAllowlist([]string{"ok.example.com:443", s})
			if !errors.Is(err, ErrBadEntry) {
				t.Fatalf("ParseAllowlist(%q) = %v, want an error wrapping ErrBadEntry", s, err)
			}
			if !strings.Contains(err.Error(), `"`+strings.ReplaceAll(s, "\n", `\n`)+`"`) {
				t.Errorf("error %q does not quote the entry %q", err, s)
			}
		})
	}
}

func TestAllows(t *testing.T) {
	a, err := ParseAllowlist([]string{"api.github.com:443", "*.pypi.org:443", "127.0.0.1:8080", "[::1]:9090", "[2001:db8::5]:443"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host string
		port int
		want bool
	}{
		{"api.github.com", 443, true},
		{"API.GitHub.com", 443, true},
		{"api.github.com.", 443, true},
		{"api.github.com", 80, false},
		{"github.com", 443, false},
		{"x.api.github.com", 443, false},
		{"api.github.com.evil.com", 443, false},
		{"files.pypi.org", 443, true},
		{"a.b.pypi.org", 443, true},
		{"Files.PyPI.org.", 443, true},
		{"pypi.org", 443, false},
		{"evilpypi.org", 443, false},
		{"files.pypi.org", 8443, false},
		{"127.0.0.1", 8080, true},
		{"::ffff:127.0.0.1", 8080, true},
		{"127.0.0.1", 8081, false},
		{"127.0.0.2", 8080, false},
		{"localhost", 8080, false},
		{"::1", 9090, true},
		{"::1", 8080, false},
		{"2001:DB8::5", 443, true},
		{"2001:db8:0::5", 443, true},
		{"fe80::1%eth0", 443, false},
		{"", 443, false},
		{"api.github.com", 0, false},
		{"api.github.com", 70000, false},
		{"a/b.pypi.org", 443, false},
		{"a b.pypi.org", 443, false},
	}
	for _, tt := range tests {
		if got := a.Allows(tt.host, tt.port); got != tt.want {
			t.Errorf("Allows(%q, %d) = %v, want %v", tt.host, tt.port, got, tt.want)
		}
	}
	var zero Allowlist
	if zero.Allows("api.github.com", 443) || zero.Allows("127.0.0.1", 8080) {
		t.Error("the zero Allowlist allows something")
	}
}

func TestParseAllowlistBounds(t *testing.T) {
	list := func(n, size int) []string {
		out := make([]string, n)
		for i := range out {
			e := fmt.Sprintf("h%d.example:443", i)
			pad := strings.Repeat("abcdefghi.", max(size-len(e), 0)/10) // labels of 9 letters
			out[i] = pad + strings.Repeat("a", max(size-len(e)-len(pad), 0)) + e
		}
		return out
	}
	// At the bounds: accepted, every entry kept.
	for _, l := range [][]string{list(MaxEntries, 0), list(MaxBytes/200, 200)} {
		a, err := ParseAllowlist(l)
		if err != nil {
			t.Fatalf("%d entries, %d bytes: %v", len(l), len(strings.Join(l, "")), err)
		}
		if len(a.Entries()) != len(l) {
			t.Fatalf("%d entries kept of %d", len(a.Entries()), len(l))
		}
	}
	for _, c := range []struct {
		name  string
		list  []string
		limit string
	}{
		{"entries", list(MaxEntries+1, 0), fmt.Sprintf("%d entries (at most %d)", MaxEntries+1, MaxEntries)},
		{"bytes", list(MaxBytes/200+1, 200), fmt.Sprintf("(at most %d)", MaxBytes)},
		// Refused by size before any entry is read, malformed ones included.
		{"huge", slices.Repeat([]string{"not an entry"}, 80000), "80000 entries"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseAllowlist(c.list)
			if !errors.Is(err, ErrTooLong) || errors.Is(err, ErrBadEntry) || !strings.Contains(err.Error(), c.limit) {
				t.Fatalf("ParseAllowlist = %v, want ErrTooLong naming %q", err, c.limit)
			}
		})
	}
}

func BenchmarkParseAllowlist(b *testing.B) {
	l := make([]string, MaxEntries)
	for i := range l {
		l[i] = fmt.Sprintf("10.0.%d.%d:443", i/250, i%250)
	}
	for b.Loop() {
		if _, err := ParseAllowlist(l); err != nil {
			b.Fatal(err)
		}
	}
}
