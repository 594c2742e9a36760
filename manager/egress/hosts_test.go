package egress

import (
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
)

// A single-label name on the allowlist is looked up in the hosts file first, as every other
// name is: "localhost" is the host's loopback there, which a name may not lead to, so it is
// refused as internal, with the address to allowlist instead, and without a DNS query (it
// used to go to DNS as "localhost.", skipping /etc/hosts).
func TestSingleLabelNamesUseTheHostsFile(t *testing.T) {
	leakcheck.Check(t)
	b, err := os.ReadFile(DefaultHostsFile)
	if err != nil || !strings.Contains(string(b), "localhost") {
		t.Skip("no localhost in " + DefaultHostsFile)
	}
	var rec recorder
	o := rec.options(nil, nil)
	o.HostsFile = "" // the default, the machine's
	p, sock := startProxy(t, o)
	mustAllow(t, p, "localhost:8000")
	_, _, res, body := connect(t, sock, "localhost:8000")
	want := "fusebox egress: localhost resolved to 127.0.0.1 (from /etc/hosts), a blocked internal address"
	if res.StatusCode != http.StatusForbidden || !strings.HasPrefix(body, want) || !strings.Contains(body, "allowlist it as 127.0.0.1:8000") {
		t.Errorf("CONNECT localhost:8000: %s %q, want 403 starting %q and naming 127.0.0.1:8000", res.Status, body, want)
	}
	if r := rec.Resolves(); len(r) != 0 {
		t.Errorf("names in the hosts file were sent to DNS: %q", r)
	}
	if d := rec.Dials(); len(d) != 0 {
		t.Errorf("dialled %q", d)
	}
}

// Every name, single-label or not, is answered by the hosts file when it names it (case and a
// trailing dot aside, re-read after an edit), and by DNS only otherwise; the internal-address
// check applies to both answers.
func TestHostsFileFirstThenDNS(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	hosts := filepath.Join(t.TempDir(), "hosts")
	write := func(s string) {
		if err := os.WriteFile(hosts, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("# a comment\n203.0.113.7 fbxalias Multi.Label.Test. # trailing comment\n10.1.2.3\tinside\n")
	var rec recorder
	o := rec.options(map[string][]netip.Addr{"dns.test.": {netip.MustParseAddr("203.0.113.9")}}, func(string) string { return echo })
	o.HostsFile = hosts
	p, sock := startProxy(t, o)
	mustAllow(t, p, "fbxalias:"+port, "multi.label.test:"+port, "inside:"+port, "dns.test:"+port)

	for _, name := range []string{"fbxalias", "FBXALIAS.", "multi.label.test", "dns.test"} {
		c, br, res, body := connect(t, sock, name+":"+port)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT %s: %s %q", name, res.Status, body)
		}
		expectEcho(t, c, br, "via "+name)
	}
	_, _, res, body := connect(t, sock, "inside:"+port)
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "inside resolved to 10.1.2.3 (from "+hosts+")") {
		t.Errorf("CONNECT inside: %s %q, want 403: an internal address from the hosts file", res.Status, body)
	}
	want := []string{"203.0.113.7:" + port, "203.0.113.7:" + port, "203.0.113.7:" + port, "203.0.113.9:" + port}
	if d := rec.Dials(); !slices.Equal(d, want) {
		t.Errorf("dials = %q, want %q", d, want)
	}
	if r := rec.Resolves(); !slices.Equal(r, []string{"dns.test."}) {
		t.Errorf("sent to DNS: %q, want only dns.test.", r)
	}

	// An edit applies to the next request: fbxalias now leads elsewhere (a different size,
	// so that a coarse modification time cannot hide the change).
	write("203.0.113.8 fbxalias\n")
	c, br, res, body := connect(t, sock, "fbxalias:"+port)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT fbxalias after the edit: %s %q", res.Status, body)
	}
	expectEcho(t, c, br, "after the edit")
	if d := rec.Dials(); d[len(d)-1] != "203.0.113.8:"+port {
		t.Errorf("after the edit dialled %s, want 203.0.113.8:%s", d[len(d)-1], port)
	}
}
