package kubetest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no ip_local_port_range:", err)
	}
	first, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		p, err := freePort(2)
		if err != nil {
			t.Fatal(err)
		}
		if p+1 >= first {
			t.Fatalf("freePort(2) = %d: inside the ephemeral range from %d", p, first)
		}
		for i := range 2 {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
			if err != nil {
				t.Fatalf("port %d of freePort(2) = %d: %v", p+i, p, err)
			}
			l.Close()
		}
	}
}

func TestFreePortSkipsTakenPorts(t *testing.T) {
	// Hold every other port of a stretch: a free pair cannot start at a held port or just
	// before one.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	taken := map[int]bool{}
	for p := 20000; p < 32000; p += 2 {
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			held = append(held, l)
			taken[p] = true
		}
	}
	for range 20 {
		p, err := freePort(2)
		if err != nil {
			t.Fatal(err)
		}
		if taken[p] || taken[p+1] {
			t.Fatalf("freePort(2) = %d: a port held by this test", p)
		}
	}
}
