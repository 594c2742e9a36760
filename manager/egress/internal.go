package egress

import "net/netip"

// blockedPrefixes are the IPv4 and IPv6 ranges a name on the allowlist may not resolve to:
// whatever is not on the public internet, where the node, the manager, other sandboxes,
// the cluster's services and the cloud's metadata endpoint live. A name that resolves into
// one of them is refused, which defeats DNS rebinding (an allowed name pointed at an internal
// address). Only IP-literal allowlist entries reach such addresses.
var blockedPrefixes = mustPrefixes(
	"0.0.0.0/8",      // "this network", including the unspecified address
	"10.0.0.0/8",     // RFC 1918
	"100.64.0.0/10",  // carrier-grade NAT (RFC 6598), also Alibaba Cloud's metadata
	"127.0.0.0/8",    // loopback
	"169.254.0.0/16", // link-local, including the metadata endpoint 169.254.169.254
	"172.16.0.0/12",  // RFC 1918
	"192.0.0.0/24",   // IETF protocol assignments
	"192.168.0.0/16", // RFC 1918
	"198.18.0.0/15",  // benchmarking
	"224.0.0.0/4",    // multicast
	"240.0.0.0/4",    // reserved, including broadcast 255.255.255.255
	"::/128",         // unspecified
	"::1/128",        // loopback
	"::/96",          // IPv4-compatible (deprecated)
	"100::/64",       // discard-only
	"fc00::/7",       // unique local, including AWS's metadata fd00:ec2::254
	"fe80::/10",      // link-local
	"ff00::/8",       // multicast
	"2001::/32",      // Teredo: tunnels to arbitrary IPv4 addresses
	"64:ff9b:1::/48", // local-use NAT64 (RFC 8215)
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // well-known NAT64 (RFC 6052)
	sixToFour = netip.MustParsePrefix("2002::/16")    // 6to4 (RFC 3056)
)

// isInternal reports whether ip is an address a resolved name may not lead to. IPv4-mapped
// IPv6 addresses are judged as IPv4; NAT64 and 6to4 addresses by the IPv4 address they
// embed, since that is where their traffic ends up.
func isInternal(ip netip.Addr) bool {
	ip = ip.WithZone("").Unmap()
	if ip.Is6() {
		b := ip.As16()
		switch {
		case nat64.Contains(ip):
			return isInternal(netip.AddrFrom4([4]byte(b[12:16])))
		case sixToFour.Contains(ip):
			return isInternal(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return true
	}
	for _, p := range blockedPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
