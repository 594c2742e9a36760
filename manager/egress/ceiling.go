package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Ceiling is the most an authorisation policy lets one caller's allocations reach: every
// entry of an allocation's Allowlist must lie inside it. It is immutable; the zero value
// permits nothing (an allocation with an empty allowlist always fits).
//
// Its entries are Allowlist entries ("api.github.com:443", "*.pypi.org:443",
// "192.0.2.10:443", "[2001:db8::1]:443") plus CIDR blocks ("10.20.0.0/16:443",
// "[2001:db8::/32]:443"), each with a port. An allowlist entry lies inside the ceiling when
// some ceiling entry with the same port covers it:
//   - a name: the same name, or a wildcard above it ("*.pypi.org" covers "files.pypi.org");
//   - a wildcard: the same wildcard or one above it ("*.pypi.org" covers "*.cdn.pypi.org");
//   - an address: the same address, or a CIDR block holding it.
//
// A name is never covered by an address or a block: names are resolved by the proxy, which
// refuses internal addresses for them, so a ceiling of addresses does not admit names.
type Ceiling struct {
	entries  []entry
	prefixes []prefixEntry
}

// prefixEntry is a CIDR block with a port.
type prefixEntry struct {
	prefix netip.Prefix
	port   uint16
}

func (p prefixEntry) String() string {
	if p.prefix.Addr().Is6() {
		return fmt.Sprintf("[%s]:%d", p.prefix, p.port)
	}
	return fmt.Sprintf("%s:%d", p.prefix, p.port)
}

// ParseCeiling parses ceiling entries (see Ceiling). Every error wraps ErrBadEntry and quotes
// the entry.
func ParseCeiling(entries []string) (Ceiling, error) {
	var c Ceiling
	for _, s := range entries {
		if p, ok, err := parsePrefixEntry(s); ok {
			if err != nil {
				return Ceiling{}, fmt.Errorf("%w %q: %s", ErrBadEntry, s, err)
			}
			if !slices.Contains(c.prefixes, p) {
				c.prefixes = append(c.prefixes, p)
			}
			continue
		}
		e, err := parseEntry(s)
		if err != nil {
			return Ceiling{}, fmt.Errorf("%w %q: %s", ErrBadEntry, s, err)
		}
		if !slices.Contains(c.entries, e) {
			c.entries = append(c.entries, e)
		}
	}
	return c, nil
}

// parsePrefixEntry parses "a.b.c.d/n:port" or "[v6/n]:port"; ok is false when s has no "/"
// in its host part (it is then an ordinary entry).
func parsePrefixEntry(s string) (prefixEntry, bool, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return prefixEntry{}, false, nil
	}
	host, portStr := s[:i], s[i+1:]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if !strings.Contains(host, "/") {
		return prefixEntry{}, false, nil
	}
	port, err := parsePort(portStr)
	if err != nil {
		return prefixEntry{}, true, err
	}
	p, err := netip.ParsePrefix(host)
	if err != nil {
		return prefixEntry{}, true, fmt.Errorf("not a CIDR block: %v", err)
	}
	if p.Addr().Is6() != strings.HasPrefix(s, "[") {
		return prefixEntry{}, true, fmt.Errorf("an IPv6 block goes in brackets ([2001:db8::/32]:443), an IPv4 one does not")
	}
	if p != p.Masked() {
		return prefixEntry{}, true, fmt.Errorf("host bits set: did you mean %s?", p.Masked())
	}
	return prefixEntry{prefix: p, port: port}, true, nil
}

// Outside returns, in canonical form, the entries of a that the ceiling does not cover (none:
// a fits).
func (c Ceiling) Outside(a Allowlist) []string {
	var out []string
	for _, e := range a.entries {
		if !c.covers(e) {
			out = append(out, e.String())
		}
	}
	return out
}

func (c Ceiling) covers(e entry) bool {
	for _, x := range c.entries {
		if x.port != e.port {
			continue
		}
		switch {
		case e.ip.IsValid():
			if x.ip == e.ip {
				return true
			}
		case e.suffix != "":
			if x.suffix != "" && strings.HasSuffix(e.suffix, x.suffix) {
				return true
			}
		default:
			if x.name == e.name || x.suffix != "" && strings.HasSuffix(e.name, x.suffix) {
				return true
			}
		}
	}
	if e.ip.IsValid() {
		for _, p := range c.prefixes {
			if p.port == e.port && p.prefix.Contains(e.ip) {
				return true
			}
		}
	}
	return false
}

// Union returns a ceiling covering what c or d covers.
func (c Ceiling) Union(d Ceiling) Ceiling {
	u := Ceiling{entries: slices.Clone(c.entries), prefixes: slices.Clone(c.prefixes)}
	for _, e := range d.entries {
		if !slices.Contains(u.entries, e) {
			u.entries = append(u.entries, e)
		}
	}
	for _, p := range d.prefixes {
		if !slices.Contains(u.prefixes, p) {
			u.prefixes = append(u.prefixes, p)
		}
	}
	return u
}

// Entries returns the ceiling's entries in canonical form.
func (c Ceiling) Entries() []string {
	out := make([]string, 0, len(c.entries)+len(c.prefixes))
	for _, e := range c.entries {
		out = append(out, e.String())
	}
	for _, p := range c.prefixes {
		out = append(out, p.String())
	}
	return out
}

// String returns the entries joined by ", ", or "nothing" for an empty ceiling.
func (c Ceiling) String() string {
	if len(c.entries)+len(c.prefixes) == 0 {
		return "nothing"
	}
	return strings.Join(c.Entries(), ", ")
}
