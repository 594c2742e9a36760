package cluster_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

// outsideIP is the address of the host outsideHost puts on the node's bridge, outside the
// pods' range (nodetest.Net .10-.250).
const outsideIP = nodetest.Net + ".253"

// listenScript accepts and closes connections on each port argument, forever.
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

// outsideHost is a host the test makes outside the cluster: a network namespace of its own
// on the node's bridge at outsideIP, accepting TCP on ports, until the test ends.
func outsideHost(t *testing.T, ports ...int) {
	t.Helper()
	ns := fmt.Sprintf("fbegress%d", os.Getpid())
	hostEnd, nsEnd := fmt.Sprintf("fbeg%dh", os.Getpid()%100000), fmt.Sprintf("fbeg%dn", os.Getpid()%100000)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() }) // takes the veth pair with it
	ip("link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd)
	ip("link", "set", nsEnd, "netns", ns)
	ip("link", "set", hostEnd, "master", nodetest.Bridge, "up")
	ip("-n", ns, "addr", "add", outsideIP+"/24", "dev", nsEnd)
	ip("-n", ns, "link", "set", nsEnd, "up")
	ip("-n", ns, "link", "set", "lo", "up")
	args := []string{"netns", "exec", ns, "/usr/bin/python3", "-c", listenScript}
	for _, p := range ports {
		args = append(args, fmt.Sprint(p))
	}
	cmd := exec.Command("ip", args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make([]byte, 64)
	if n, err := out.Read(line); err != nil || !strings.HasPrefix(string(line[:n]), "listening") {
		t.Fatalf("the outside host's listener did not start: %q %v", line[:n], err)
	}
}

// TestEgressAllowlistOnARealNode: under the plain-NetworkPolicy flavour (kube-router), the
// address:port a sandbox's allowlist names becomes reachable from that bound sandbox, and
// from nothing else: not the same host's other port, not another bound sandbox of the same
// namespace, not another pod there.
func TestEgressAllowlistOnARealNode(t *testing.T) {
	n := realNode(t)
	m, _, ns := newManager(t, n)
	applyNamespacePolicies(t, n, ns)
	outsideHost(t, 8080, 8081)
	allowed, other := outsideIP+":8080", outsideIP+":8081"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	key, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	al, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: []string{allowed}})
	if err != nil {
		t.Fatalf("Allocate with an allowlist: %v\n%s", err, n.Logs())
	}
	// Released at the end: the node's CPU holds a few sandboxes, and the tests after this one
	// allocate on it too.
	t.Cleanup(func() { m.Release(context.Background(), al.ID, al.LeaseToken) })
	withEgress, err := client.Dial(al.Endpoint, al.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer withEgress.Close()
	alB, keyB := allocate(t, ctx, n, m)
	t.Cleanup(func() { m.Release(context.Background(), alB.ID, alB.LeaseToken) })
	without, err := client.Dial(alB.Endpoint, alB.SandboxKey, keyB)
	if err != nil {
		t.Fatal(err)
	}
	defer without.Close()

	run := func(sb *client.Sandbox, targets ...string) map[string]string {
		t.Helper()
		res, err := sb.Run(ctx, append([]string{"python3", "-c", nodetest.ProbeScript}, targets...)...)
		if err != nil {
			t.Fatal(err)
		}
		return nodetest.ProbeResults(string(res.Stdout))
	}
	// The allowed target is retried: the policy reaches kube-router's sets some seconds after
	// the allocation.
	if got := run(withEgress, allowed+"+", other); got[allowed] != "open" || got[other] != "blocked" {
		t.Fatalf("from the sandbox allowed %s: %v, want it open and %s blocked", allowed, got, other)
	}
	// Where allowed must be blocked, the other port goes first as a canary: once it is
	// blocked, the namespace's default deny has reached the pod (a new pod's traffic passes
	// until kube-router's next sync takes it in), and the allowlist is judged under it.
	if got := run(without, other+"-", allowed); got[other] != "blocked" || got[allowed] != "blocked" {
		t.Fatalf("from a bound sandbox without an allowlist: %v, want both blocked", got)
	}
	got := probe(t, n, ns, map[string]string{"app": "curious"}, other+"-", allowed)
	if got[other] != "blocked" || got[allowed] != "blocked" {
		t.Fatalf("from another pod of the sandbox namespace: %v, want %s and %s blocked", got, other, allowed)
	}
}
