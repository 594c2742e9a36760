package egress

import (
	"net/netip"
	"testing"
)

func TestIsInternal(t *testing.T) {
	internal := []string{
		"127.0.0.1", "127.255.0.9", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "169.254.0.1", "100.64.0.1", "100.100.100.200", "0.0.0.0", "0.1.2.3",
		"224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1", "198.18.0.1", "192.0.0.8",
		"::", "::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1", "fc00::1",
		"fd00:ec2::254", "fe80::1", "fe80::1%eth0", "ff02::1", "64:ff9b::7f00:1",
		"64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "2002:a00:1::", "2001::1", "64:ff9b:1::1", "100::1",
	}
	public := []string{
		// Documentation and other non-internal addresses: classified, never dialled.
		"198.51.100.7", "192.0.2.1", "203.0.113.5", "100.128.0.1", "172.32.0.1", "::ffff:198.51.100.7",
		"2001:db8::1", "64:ff9b::c633:6407", "2002:c633:6407::1",
	}
	for _, s := range internal {
		if !isInternal(netip.MustParseAddr(s)) {
			t.Errorf("isInternal(%s) = false, want true", s)
		}
	}
	for _, s := range public {
		if isInternal(netip.MustParseAddr(s)) {
			t.Errorf("isInternal(%s) = true, want false", s)
		}
	}
	if !isInternal(netip.Addr{}) {
		t.Error("the invalid address is not internal")
	}
}
