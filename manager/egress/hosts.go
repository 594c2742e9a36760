package egress

import (
	"bufio"
	"bytes"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
)

// DefaultHostsFile is the hosts file the proxy reads before it asks DNS.
const DefaultHostsFile = "/etc/hosts"

// hostsFile answers names from a hosts(5) file, the first step of the proxy's resolution, for
// every name alike: single-label ("localhost", an operator's alias) or not. It re-reads the
// file when its modification time or size changes, so an edit applies to the next request.
type hostsFile struct {
	path string

	mu      sync.Mutex // guards the fields below
	modTime time.Time
	size    int64
	byName  map[string][]netip.Addr
}

// lookup returns name's addresses in the file (name lower case, without a trailing dot);
// ok is false when the file does not name it (or cannot be read: then DNS decides).
func (h *hostsFile) lookup(name string) ([]netip.Addr, bool) {
	fi, err := os.Stat(h.path)
	if err != nil {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byName == nil || !fi.ModTime().Equal(h.modTime) || fi.Size() != h.size {
		b, err := os.ReadFile(h.path)
		if err != nil {
			return nil, false
		}
		h.byName, h.modTime, h.size = parseHosts(b), fi.ModTime(), fi.Size()
	}
	addrs, ok := h.byName[name]
	return addrs, ok
}

// parseHosts reads hosts(5) lines: an address, then its names; '#' starts a comment. Names
// are kept lower case without a trailing dot; lines whose address does not parse are skipped.
func parseHosts(b []byte) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		ip, err := netip.ParseAddr(f[0])
		if err != nil {
			continue
		}
		ip = ip.WithZone("").Unmap()
		for _, n := range f[1:] {
			n = strings.TrimSuffix(strings.ToLower(n), ".")
			if n != "" {
				out[n] = append(out[n], ip)
			}
		}
	}
	return out
}
