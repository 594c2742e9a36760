package nodetest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ProbeScript connects to each host:port argument (3 s a try) and prints "open" or "blocked"
// for it; it exits 0. A target given as host:port+ is tried for up to 30 s until it connects:
// a new pod's address reaches the NetworkPolicy agent's sets some seconds after it starts.
// A target given as host:port- is tried for up to 30 s until it is blocked: a canary the
// policies deny, put first, shows that they have reached the new pod before the targets
// after it are judged.
// It needs python3 (the test sandbox image and the release sandbox image have it).
const ProbeScript = `
import socket, sys, time
for arg in sys.argv[1:]:
    until = {"+": "open", "-": "blocked"}.get(arg[-1])
    hp = arg.rstrip("+-")
    h, p = hp.rsplit(":", 1)
    deadline = time.time() + (30 if until else 0)
    while True:
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect((h, int(p)))
            got, why = "open", ""
        except Exception as e:
            got, why = "blocked", type(e).__name__
        finally:
            s.close()
        if until in (None, got) or time.time() >= deadline:
            print(hp, got, why)
            break
        time.sleep(0.5)
`

// ProbeResults reads ProbeScript's output: "open" or "blocked" by target.
func ProbeResults(out string) map[string]string {
	res := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			res[f[0]] = f[1]
		}
	}
	return res
}

// Probe runs ProbeScript against targets in a gVisor pod on the node, in namespace ns (made
// if missing) with labels, from image, and returns its results by target.
func (n *Node) Probe(ctx context.Context, ns string, labels map[string]string, image string, targets ...string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c := n.Env.Client.CoreV1()
	if err := n.Namespace(ctx, ns); err != nil {
		return nil, err
	}
	uid := int64(65532)
	name := fmt.Sprintf("probe-%d", time.Now().UnixNano()%1e9)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.PodSpec{
		RuntimeClassName: ptr.To("gvisor"), NodeName: NodeName, RestartPolicy: corev1.RestartPolicyNever,
		AutomountServiceAccountToken: ptr.To(false),
		SecurityContext:              &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid},
		Containers: []corev1.Container{{Name: "probe", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: append([]string{"python3", "-c", ProbeScript}, targets...)}},
	}}
	pods := c.Pods(ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	defer pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	for {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("probe pod %s/%s did not finish: %s\n%s", ns, name, p.Status.Phase, n.Logs())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return ProbeResults(n.PodLog(ns, name, "probe")), nil
}

// ImageDigest returns the digest (sha256:...) of image ref as the node's containerd holds it.
func (n *Node) ImageDigest(ctx context.Context, ref string) (string, error) {
	out, err := exec.CommandContext(ctx, n.ctr(), "-a", n.sock(), "-n", "k8s.io", "images", "ls", "name=="+ref).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ctr images ls name==%s: %w\n%s", ref, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == ref && strings.HasPrefix(f[2], "sha256:") {
			return f[2], nil
		}
	}
	return "", fmt.Errorf("ctr images ls name==%s: no digest in\n%s", ref, out)
}

// Tag names image src (as imported) ref too in the node's containerd, e.g. by digest
// (repository@sha256:...), the way a stack's release names it: the kubelet then finds the
// image the stack pins without a registry.
func (n *Node) Tag(ctx context.Context, src, ref string) error {
	return n.ctrRun(ctx, "images", "tag", "--force", src, ref)
}

// Namespace makes namespace ns if it is missing and, under Options.Deployments (the
// serviceaccount and root-ca-certificate-publisher controllers run), waits for what those
// controllers add to it: its default ServiceAccount and its kube-root-ca.crt ConfigMap. A
// test that snapshots the API server's objects after making a namespace finds them settled.
func (n *Node) Namespace(ctx context.Context, ns string) error {
	c := n.Env.Client.CoreV1()
	if _, err := c.Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		if _, err := c.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if !n.deployments {
		return nil
	}
	return n.waitFor(ctx, "ServiceAccount "+ns+"/default and ConfigMap "+ns+"/kube-root-ca.crt", time.Minute, func() bool {
		if _, err := c.ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false
		}
		_, err := c.ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil
	})
}
