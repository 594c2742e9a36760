// Package cluster_test runs fusebox's kube allocator against a real single-node cluster
// (test/nodetest): sandbox pods are real gVisor pods started by a kubelet through containerd
// and the gVisor shim, from the test sandbox image imported into the node, on a bridge the
// test creates, with kube-router enforcing NetworkPolicy. No kwok: every pod the manager hands
// out runs the sandbox server, and the agent talks to it at its pod IP.
package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/clustertest"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

var nodes clustertest.Node

func TestMain(m *testing.M) { os.Exit(nodes.StopAtExit(m.Run())) }

// realNode starts the node (kube-router) once per test binary.
func realNode(t *testing.T) *nodetest.Node { return nodes.Get(t, nodetest.Options{}) }

// newManager returns a started manager on plain NetworkPolicy, which kube-router enforces.
func newManager(t *testing.T, n *nodetest.Node) (*manager.Manager, *kubealloc.Allocator, string) {
	return clustertest.NewManager(t, n, sandboxnet.Kubernetes)
}

// TestAllocateExecOnARealNode: an allocation through the manager gets a real gVisor pod; the
// agent runs a command in it and moves 100 files over the direct, pinned data plane to the
// pod's IP; a release deletes the pod.
func TestAllocateExecOnARealNode(t *testing.T) {
	n := realNode(t)
	m, a, ns := newManager(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	al, key := clustertest.Allocate(t, ctx, n, m)
	if !strings.HasPrefix(al.Endpoint, "tcp://"+nodetest.Net+".") {
		t.Fatalf("endpoint %q is not a pod address on the test bridge", al.Endpoint)
	}
	sb, err := client.Dial(al.Endpoint, al.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Run(ctx, "cat", "/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Stdout), "gVisor") && !strings.Contains(string(res.Stdout), "gvisor") {
		t.Fatalf("/proc/version = %q, want gVisor's", res.Stdout)
	}
	files := make([]client.File, 100)
	for i := range files {
		files[i] = client.File{Path: fmt.Sprintf("d%d/f%03d.txt", i%10, i), Data: bytes.Repeat([]byte{byte(i)}, 1000+i), Mode: 0o644}
	}
	if _, err := sb.WriteFiles(ctx, files, nil, nil); err != nil {
		t.Fatal(err)
	}
	got, _, err := sb.ReadFiles(ctx, "d*/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(files) {
		t.Fatalf("read back %d files, want %d", len(got), len(files))
	}
	for _, f := range files {
		if !bytes.Equal(got[f.Path], f.Data) {
			t.Fatalf("%s differs after the round trip", f.Path)
		}
	}
	pod, err := n.Env.Client.CoreV1().Pods(ns).Get(ctx, al.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != nodetest.NodeName || *pod.Spec.RuntimeClassName != "gvisor" {
		t.Fatalf("pod on node %q with runtime class %q", pod.Spec.NodeName, *pod.Spec.RuntimeClassName)
	}
	if err := m.Release(ctx, al.ID, al.LeaseToken); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := a.Lookup(ctx, al.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("released pod %s still there", al.ID)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNetworkPolicyOnARealNode: with the sandbox namespace's policies from policies/sandboxnet
// (plain NetworkPolicy, enforced by kube-router), a pod outside the agents cannot reach a
// bound sandbox's init or data port while an agent pod reaches its data port, and the
// sandbox itself reaches neither the node nor another sandbox.
func TestNetworkPolicyOnARealNode(t *testing.T) {
	n := realNode(t)
	m, _, ns := newManager(t, n)
	clustertest.ApplyNamespacePolicies(t, n, ns, sandboxnet.Kubernetes)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var boxes [2]*client.Sandbox
	var hosts [2]string
	for i := range boxes {
		key, _ := client.NewKey()
		al, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
		if err != nil {
			t.Fatalf("Allocate: %v\n%s", err, n.Logs())
		}
		if boxes[i], err = client.Dial(al.Endpoint, al.SandboxKey, key); err != nil {
			t.Fatal(err)
		}
		defer boxes[i].Close()
		hosts[i] = strings.TrimSuffix(strings.TrimPrefix(al.Endpoint, "tcp://"), fmt.Sprintf(":%d", kubealloc.DataPort))
	}
	initA := fmt.Sprintf("%s:%d", hosts[0], kubealloc.InitPort)
	dataA := fmt.Sprintf("%s:%d", hosts[0], kubealloc.DataPort)
	dataB := fmt.Sprintf("%s:%d", hosts[1], kubealloc.DataPort)
	// The agent (this host) still reaches its sandbox over the data plane.
	if _, err := boxes[0].Run(ctx, "true"); err != nil {
		t.Fatalf("the agent lost its sandbox under the policies: %v", err)
	}
	// An agent pod reaches the data port (so the probe can see an open port) but not init.
	got := clustertest.Probe(t, n, "agents", map[string]string{"fusebox.dev/role": "agent"}, dataA+"+", initA)
	if got[dataA] != "open" || got[initA] != "blocked" {
		t.Fatalf("from an agent pod: %v, want the data port open and init blocked", got)
	}
	// Any other pod reaches neither.
	got = clustertest.Probe(t, n, "elsewhere", map[string]string{"app": "curious"}, dataA, initA)
	if got[dataA] != "blocked" || got[initA] != "blocked" {
		t.Fatalf("from a pod outside the agents: %v, want both ports blocked", got)
	}
	// The sandbox reaches neither the node's kubelet nor another sandbox.
	kubelet := nodetest.NodeIP + ":20250"
	res, err := boxes[0].Run(ctx, append([]string{"python3", "-c", nodetest.ProbeScript}, kubelet, dataB)...)
	if err != nil {
		t.Fatal(err)
	}
	got = nodetest.ProbeResults(string(res.Stdout))
	if got[kubelet] != "blocked" || got[dataB] != "blocked" {
		t.Fatalf("from inside a sandbox: %v (stderr %q), want the node and the other sandbox blocked", got, res.Stderr)
	}
}
