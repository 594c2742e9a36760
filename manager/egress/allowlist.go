package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// ErrBadEntry is wrapped by every error ParseAllowlist returns for a malformed entry.
var ErrBadEntry = errors.New("malformed egress allowlist entry")

// The bounds of one allowlist, checked before any entry is parsed: an allocation's list travels
// in the sandbox's init message, in its lease (every List answer carries it) and, in
// clusters, in a network policy.
const (
	// MaxEntries is the most entries an allowlist may have.
	MaxEntries = 256
	// MaxBytes is the most bytes its entries may have together.
	MaxBytes = 8 << 10
)

// ErrTooLong is wrapped by CheckSize's and ParseAllowlist's errors for a list over the bounds.
var ErrTooLong = errors.New("egress allowlist too long")

// CheckSize reports whether entries fit the bounds (MaxEntries, MaxBytes), reading only the
// entries' lengths. Its error wraps ErrTooLong and names the bound.
func CheckSize(entries []string) error {
	if len(entries) > MaxEntries {
		return fmt.Errorf("%w: %d entries (at most %d)", ErrTooLong, len(entries), MaxEntries)
	}
	n := 0
	for _, s := range entries {
		n += len(s)
	}
	if n > MaxBytes {
		return fmt.Errorf("%w: %d bytes in its entries (at most %d)", ErrTooLong, n, MaxBytes)
	}
	return nil
}

// maxNameLen is the longest DNS name in presentation form, without the trailing dot.
const maxNameLen = 253

// entry is one parsed allowlist entry. Exactly one of name, suffix and ip is set.
type entry struct {
	name   string     // exact DNS name, lower case, no trailing dot
	suffix string     // for "*.example.com": ".example.com"
	ip     netip.Addr // an IP literal, IPv4-mapped IPv6 unmapped, no zone
	port   uint16
}

func (e entry) String() string {
	switch {
	case e.ip.IsValid():
		return netip.AddrPortFrom(e.ip, e.port).String()
	case e.suffix != "":
		return "*" + e.suffix + ":" + strconv.Itoa(int(e.port))
	default:
		return e.name + ":" + strconv.Itoa(int(e.port))
	}
}

// Allowlist is the set of destinations one sandbox may reach through the egress proxy. It is
// immutable; the zero value allows nothing.
//
// Each entry is "host:port" and the port is always required: there is no any-port form,
// because "any port of this host" is almost never what an allocation means and would open
// every service the host runs. The host is one of:
//   - a DNS name ("api.github.com"): matched exactly, case-insensitively, a trailing dot
//     ignored. ASCII only: write internationalised names in their xn-- form.
//   - a wildcard "*.example.com": any name below example.com (a.example.com, a.b.example.com),
//     not example.com itself. The part after "*." must have at least two labels, so "*",
//     "*." and "*.com" are refused.
//   - an IPv4 literal ("192.0.2.10") or a bracketed IPv6 literal ("[2001:db8::1]"): matched
//     only by a request for exactly that address (never by a name that resolves to it).
//
// Names are resolved by the proxy, which refuses internal addresses for them (see Proxy); IP
// literals are an explicit decision to reach that address and are not filtered, so
// "127.0.0.1:8080" or even "169.254.169.254:80" can be allowed on purpose.
type Allowlist struct {
	entries []entry
}

// ParseAllowlist parses "host:port" entries (see Allowlist), in time linear in their size. A
// list over the bounds is refused first (CheckSize, ErrTooLong). Duplicates are accepted and
// kept once. Every error about an entry wraps ErrBadEntry and quotes the entry. An empty list
// is valid and allows nothing.
func ParseAllowlist(entries []string) (Allowlist, error) {
	if err := CheckSize(entries); err != nil {
		return Allowlist{}, err
	}
	var a Allowlist
	seen := make(map[entry]bool, len(entries))
	for _, s := range entries {
		e, err := parseEntry(s)
		if err != nil {
			return Allowlist{}, fmt.Errorf("%w %q: %s", ErrBadEntry, s, err)
		}
		if !seen[e] {
			seen[e] = true
			a.entries = append(a.entries, e)
		}
	}
	return a, nil
}

// parseEntry parses one entry; its errors are plain reasons, wrapped by ParseAllowlist.
func parseEntry(s string) (entry, error) {
	if s == "" {
		return entry{}, errors.New("empty")
	}
	if strings.Contains(s, "://") {
		return entry{}, errors.New("want host:port, not a URL (no scheme)")
	}
	for _, r := range s {
		switch {
		case r > 0x7e:
			return entry{}, errors.New("non-ASCII characters: write internationalised names in their xn-- form")
		case r <= ' ':
			return entry{}, errors.New("contains spaces or control characters")
		case r == '/' || r == '?' || r == '#' || r == '@':
			return entry{}, fmt.Errorf("contains %q: want host:port only (no path, query or user)", r)
		}
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return entry{}, errors.New("want host:port with a port (IPv6 in brackets: [2001:db8::1]:443)")
	}
	port, err := parsePort(portStr)
	if err != nil {
		return entry{}, err
	}
	if strings.HasPrefix(s, "[") {
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return entry{}, errors.New("brackets are only for an IPv6 address (without a zone)")
		}
		return entry{ip: ip.Unmap(), port: port}, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !ip.Is4() {
			return entry{}, errors.New("an IPv6 address must be in brackets")
		}
		return entry{ip: ip, port: port}, nil
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		name, err := canonicalName(rest)
		if err != nil {
			return entry{}, fmt.Errorf("wildcard: %w", err)
		}
		if !strings.Contains(name, ".") {
			return entry{}, errors.New("a wildcard needs a name of at least two labels after \"*.\" (like *.example.com)")
		}
		return entry{suffix: "." + name, port: port}, nil
	}
	if strings.Contains(host, "*") {
		return entry{}, errors.New(`"*" is only allowed as the whole first label ("*.example.com")`)
	}
	name, err := canonicalName(host)
	if err != nil {
		return entry{}, err
	}
	return entry{name: name, port: port}, nil
}

// parsePort parses a decimal port in 1-65535.
func parsePort(s string) (uint16, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("port %q is not a number (a port is required; there is no any-port form)", s)
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q is not in 1-65535", s)
	}
	return uint16(n), nil
}

// canonicalName lower-cases a DNS name, removes one trailing dot and checks its syntax:
// labels of 1-63 letters, digits, hyphens (not first or last) and underscores, at most 253
// characters, and a last label that is not all digits (so "1.2.3" or "010.1.1.1", which some
// resolvers read as IPv4 addresses, are not names).
func canonicalName(s string) (string, error) {
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if s == "" {
		return "", errors.New("empty host")
	}
	if len(s) > maxNameLen {
		return "", fmt.Errorf("name longer than %d characters", maxNameLen)
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("invalid name %q: every label must have 1-63 characters", s)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("invalid name %q: a label cannot start or end with a hyphen", s)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("invalid name %q: character %q", s, c)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", fmt.Errorf("invalid name %q: neither an IP address nor a name (the last label is numeric)", s)
	}
	return s, nil
}

// Allows reports whether the list names host:port. host is a DNS name (case and one trailing
// dot ignored) or an IP address without brackets; a name only matches name and wildcard
// entries and an address only matches IP entries.
func (a Allowlist) Allows(host string, port int) bool {
	_, ok := a.match(host, port)
	return ok
}

// match is Allows that also returns the canonical name (empty for an address) or the address.
func (a Allowlist) match(host string, port int) (dest, bool) {
	if port < 1 || port > 65535 {
		return dest{}, false
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return dest{}, false
		}
		ip = ip.Unmap()
		for _, e := range a.entries {
			if e.ip == ip && int(e.port) == port {
				return dest{ip: ip, port: uint16(port)}, true
			}
		}
		return dest{}, false
	}
	name, err := canonicalName(host)
	if err != nil {
		return dest{}, false
	}
	for _, e := range a.entries {
		if int(e.port) != port {
			continue
		}
		if e.name != "" && e.name == name || e.suffix != "" && strings.HasSuffix(name, e.suffix) {
			return dest{name: name, port: uint16(port)}, true
		}
	}
	return dest{}, false
}

// dest is a destination that passed the allowlist: a name to resolve or an address to dial.
type dest struct {
	name string
	ip   netip.Addr
	port uint16
}

// Entries returns the entries in canonical form ("api.github.com:443", "*.pypi.org:443",
// "[2001:db8::1]:443"), in the order first given, without duplicates.
func (a Allowlist) Entries() []string {
	out := make([]string, len(a.entries))
	for i, e := range a.entries {
		out[i] = e.String()
	}
	return out
}

// String returns the entries joined by ", ", or "" for an empty list.
func (a Allowlist) String() string { return strings.Join(a.Entries(), ", ") }
