package nodetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
)

// listenScript accepts and closes connections on each port argument, on every address,
// forever.
const listenScript = `
import socket, sys, threading
def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    while True:
        c, _ = s.accept()
        c.close()
for p in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
`

// outsideTable is the routing table (and rule priority) that sends the pods' traffic for an
// outside host's extra addresses to the bridge.
const outsideTable = "2213"

var outsideSeq atomic.Int32

// OutsideHost is a host outside the cluster that a test makes: a network namespace of its
// own on the node's bridge, accepting TCP connections on some ports of each of its addresses
// until Close.
type OutsideHost struct {
	ns     string
	extra  []string
	listen *exec.Cmd
}

// StartOutsideHost starts an outside host at addr (in Net's /24, outside the pods' range:
// Net.251-Net.254) and, under Options.Cilium, at the extra addresses too: addresses beyond
// the bridge's /24 (a cloud's metadata address, an Internet-like documentation address) to
// which only the pods' traffic is routed, by a rule for PodCIDR's sources (the host's own
// traffic to them goes where it went before), so a test can show a policy denying an address
// that a pod outside the policy does reach. The host accepts on ports on every address.
func (n *Node) StartOutsideHost(ctx context.Context, addr string, extra []string, ports ...int) (_ *OutsideHost, err error) {
	if len(extra) > 0 && n.cilium == "" {
		return nil, errors.New("outside host: extra addresses need the cilium flavour (bridge CNI's pods have only the bridge's route)")
	}
	seq := outsideSeq.Add(1)
	h := &OutsideHost{ns: fmt.Sprintf("fbout%d-%d", os.Getpid(), seq), extra: extra}
	hostEnd, nsEnd := fmt.Sprintf("fbo%d-%dh", os.Getpid()%100000, seq), fmt.Sprintf("fbo%d-%dn", os.Getpid()%100000, seq)
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	cmds := [][]string{
		{"netns", "add", h.ns},
		{"link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd},
		{"link", "set", nsEnd, "netns", h.ns},
		{"link", "set", hostEnd, "master", Bridge, "up"},
		{"-n", h.ns, "addr", "add", addr + "/24", "dev", nsEnd},
		{"-n", h.ns, "link", "set", nsEnd, "up"},
		{"-n", h.ns, "link", "set", "lo", "up"},
		// Replies to the pods (PodCIDR under Cilium) go back through the node.
		{"-n", h.ns, "route", "add", "default", "via", NodeIP},
	}
	for _, a := range extra {
		cmds = append(cmds,
			[]string{"-n", h.ns, "addr", "add", a + "/32", "dev", nsEnd},
			[]string{"route", "replace", a + "/32", "via", addr, "dev", Bridge, "table", outsideTable},
			[]string{"rule", "add", "from", PodCIDR, "to", a + "/32", "lookup", outsideTable, "priority", outsideTable})
	}
	for _, c := range cmds {
		if out, err := exec.CommandContext(ctx, "ip", c...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %w\n%s", strings.Join(c, " "), err, out)
		}
	}
	args := []string{"netns", "exec", h.ns, "/usr/bin/python3", "-c", listenScript}
	for _, p := range ports {
		args = append(args, fmt.Sprint(p))
	}
	h.listen = exec.Command("ip", args...)
	out, err := h.listen.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := h.listen.Start(); err != nil {
		return nil, err
	}
	line := make([]byte, 64)
	if k, err := out.Read(line); err != nil || !strings.HasPrefix(string(line[:k]), "listening") {
		return nil, fmt.Errorf("the outside host's listener did not start: %q %v", line[:k], err)
	}
	return h, nil
}

// Close stops the listener and removes the namespace (its veth pair with it) and the routes
// to the extra addresses.
func (h *OutsideHost) Close() error {
	if h.listen != nil && h.listen.Process != nil {
		h.listen.Process.Kill()
		h.listen.Wait()
	}
	for _, a := range h.extra {
		exec.Command("ip", "rule", "del", "from", PodCIDR, "to", a+"/32", "lookup", outsideTable).Run()
		exec.Command("ip", "route", "del", a+"/32", "table", outsideTable).Run()
	}
	if out, err := exec.Command("ip", "netns", "delete", h.ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns delete %s: %w\n%s", h.ns, err, out)
	}
	return nil
}
