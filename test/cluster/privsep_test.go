package cluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/test/clustertest"
)

// attackServerScript, run as a sandbox's command, prints the command's user, the user ids of
// PID 1 (the sandbox server) and what became of a listing of the server's descriptors and of a
// SIGKILL to it ("done" or the exception: PermissionError is EPERM or EACCES), one
// "name value" line each. (The test image's python3 has no json module.)
const attackServerScript = `
import os
print("uid", os.getuid())
for l in open("/proc/1/status"):
    if l.startswith("Uid:"):
        print("server_uids", ",".join(l.split()[1:]))
print("server_cmd", open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode())
try:
    os.listdir("/proc/1/fd")
    print("fd", "done")
except OSError as e:
    print("fd", type(e).__name__, e.errno)
try:
    os.kill(1, 9)
    print("kill", "done")
except OSError as e:
    print("kill", type(e).__name__, e.errno)
`

// TestCommandsCannotKillTheServerOnARealNode: in a sandbox pod, a command runs as another user
// than the sandbox server (PID 1), cannot list the server's descriptors and cannot kill it
// (EPERM); the server keeps serving and its container never restarted.
func TestCommandsCannotKillTheServerOnARealNode(t *testing.T) {
	n := realNode(t)
	m, _, ns := newManager(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	al, key := clustertest.Allocate(t, ctx, n, m)
	sb, err := client.Dial(al.Endpoint, al.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Run(ctx, "python3", "-c", attackServerScript)
	if err != nil {
		t.Fatalf("running the attack (a server killed by it ends the call): %v\n%s", err, n.PodLog(ns, al.ID, "sandbox"))
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	t.Logf("from a command: %q (stderr %q)", got, res.Stderr)
	if !strings.HasSuffix(got["server_cmd"], "fusebox-sandbox") {
		t.Fatalf("PID 1 is %q, not the sandbox server", got["server_cmd"])
	}
	// /proc/1/status: real, effective, saved and filesystem uid.
	if uids := strings.Split(got["server_uids"], ","); got["uid"] != "65532" || len(uids) != 4 || uids[0] != "0" || uids[2] != "0" {
		t.Errorf("command uid %s, server's uids %s: want the command as 65532 and the server's real and saved uid root", got["uid"], got["server_uids"])
	}
	if got["kill"] != "PermissionError 1" {
		t.Errorf("kill -9 1 from a command: %q, want EPERM", got["kill"])
	}
	if !strings.HasPrefix(got["fd"], "PermissionError") {
		t.Errorf("listing the server's /proc/1/fd from a command: %q, want it refused", got["fd"])
	}
	if _, err := sb.Run(ctx, "true"); err != nil {
		t.Fatalf("the server stopped serving after the attack: %v", err)
	}
	pod, err := n.Env.Client.CoreV1().Pods(ns).Get(ctx, al.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := pod.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 0 || cs[0].State.Running == nil {
		t.Fatalf("sandbox container status %+v, want running and never restarted", cs)
	}
}

// TestDeadServerIsFailedOnARealNode: when a bound pod's sandbox server is killed (through the
// node's container runtime), the manager lists the unit failed with the reason, and the agent's
// renewal is refused naming it.
func TestDeadServerIsFailedOnARealNode(t *testing.T) {
	n := realNode(t)
	m, _, ns := newManager(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	al, _ := clustertest.Allocate(t, ctx, n, m)
	pod, err := n.Env.Client.CoreV1().Pods(ns).Get(ctx, al.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("container statuses %+v", pod.Status.ContainerStatuses)
	}
	if err := n.KillContainer(ctx, pod.Status.ContainerStatuses[0].ContainerID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	var u manager.Unit
	for {
		for _, x := range m.List() {
			if x.Info.ID == al.ID {
				u = x
			}
		}
		if u.State == manager.Failed || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if u.State != manager.Failed || !strings.Contains(u.Err, "exit code 137") || u.Lease == nil {
		p, _ := n.Env.Client.CoreV1().Pods(ns).Get(ctx, al.ID, metav1.GetOptions{})
		var st []corev1.ContainerStatus
		if p != nil {
			st = p.Status.ContainerStatuses
		}
		t.Fatalf("unit %s after its server was killed: state %s, error %q, lease %v; want failed with the exit code, still its owner's (pod status %+v)",
			al.ID, u.State, u.Err, u.Lease, st)
	}
	t.Logf("listed: %s: %s", u.State, u.Err)
	_, err = m.Renew(ctx, al.ID, al.LeaseToken, 0)
	if !errors.Is(err, manager.ErrLeaseEnded) || !strings.Contains(err.Error(), "exit code 137") {
		t.Fatalf("Renew of the failed unit = %v, want the lease ended, naming the exit", err)
	}
	t.Logf("Renew: %v", err)
}
