package nodetest

import (
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// DNSServiceIP is the kube-dns Service's address under StartDNS: pass it as
// Options.ClusterDNS so that the kubelet hands it to every pod.
const DNSServiceIP = "10.0.0.10"

// dnsScript answers A queries for each name=address argument (TTL 5 s) over UDP and TCP on
// port 53: NOERROR without an answer for other types of those names, NXDOMAIN for any other
// name. Only python3-minimal's modules (no json, no dnslib).
const dnsScript = `
import socket, struct, sys, threading
names = dict(a.lower().split("=") for a in sys.argv[1:])
def answer(q):
    tid = q[:2]
    i, labels = 12, []
    while q[i]:
        labels.append(q[i+1:i+1+q[i]].decode().lower())
        i += 1 + q[i]
    qtype = struct.unpack(">H", q[i+1:i+3])[0]
    question = q[12:i+5]
    ip = names.get(".".join(labels))
    if ip and qtype == 1:
        rr = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ip)
        return tid + struct.pack(">HHHHH", 0x8580, 1, 1, 0, 0) + question + rr
    return tid + struct.pack(">HHHHH", 0x8580 if ip else 0x8583, 1, 0, 0, 0) + question
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 53))
    while True:
        q, peer = s.recvfrom(4096)
        try:
            s.sendto(answer(q), peer)
        except Exception as e:
            print("bad query", e, flush=True)
def tcp_conn(c):
    try:
        while True:
            n = c.recv(2)
            if len(n) < 2:
                return
            q = b""
            while len(q) < struct.unpack(">H", n)[0]:
                q += c.recv(4096)
            a = answer(q)
            c.sendall(struct.pack(">H", len(a)) + a)
    except Exception as e:
        print("bad query", e, flush=True)
    finally:
        c.close()
def tcp():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 53))
    s.listen(16)
    while True:
        threading.Thread(target=tcp_conn, args=(s.accept()[0],), daemon=True).start()
threading.Thread(target=tcp, daemon=True).start()
print("serving", sorted(names), flush=True)
udp()
`

// StartDNS runs the cluster's DNS for a test: a pod of kube-system labelled
// k8s-app=kube-dns (what the sandbox policies' DNS rule selects) from image (python3),
// answering names (name to IPv4 address) and nothing else, behind the kube-dns Service at
// DNSServiceIP. It needs Options.Deployments (kube-proxy) and returns once the Service leads
// to the pod. The pod and Service stay until the node stops.
func (n *Node) StartDNS(ctx context.Context, image string, names map[string]string) error {
	if !n.deployments {
		return fmt.Errorf("the test's DNS needs Options.Deployments (Services)")
	}
	args := []string{"python3", "-c", dnsScript}
	for name, ip := range names {
		args = append(args, name+"="+ip)
	}
	sort.Strings(args[3:])
	labels := map[string]string{"k8s-app": "kube-dns"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "fusebox-test-dns", Labels: labels}, Spec: corev1.PodSpec{
		RuntimeClassName: ptr.To("gvisor"), NodeName: NodeName, AutomountServiceAccountToken: ptr.To(false),
		DNSPolicy: corev1.DNSDefault, // its own resolv.conf is the node's: empty
		Containers: []corev1.Container{{Name: "dns", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: args,
			// Port 53: root inside the gVisor sandbox.
			SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(0))}}},
	}}
	if err := n.Namespace(ctx, "kube-system"); err != nil {
		return err
	}
	c := n.Env.Client.CoreV1()
	if _, err := c.Pods("kube-system").Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the DNS pod: %w", err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Labels: labels}, Spec: corev1.ServiceSpec{
		ClusterIP: DNSServiceIP, Selector: labels,
		Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
		},
	}}
	if _, err := c.Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the kube-dns Service: %w", err)
	}
	var podIP string
	if err := n.waitFor(ctx, "the DNS pod to run", 3*time.Minute, func() bool {
		p, err := c.Pods("kube-system").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return false
		}
		podIP = p.Status.PodIP
		return strings.Contains(n.PodLog("kube-system", pod.Name, "dns"), "serving")
	}); err != nil {
		return err
	}
	// kube-proxy's rules lead the Service's address to the pod.
	return n.waitFor(ctx, "kube-proxy's rules for kube-dns", time.Minute, func() bool {
		out, err := exec.CommandContext(ctx, "iptables-save", "-t", "nat").Output()
		return err == nil && strings.Contains(string(out), DNSServiceIP+"/32") && strings.Contains(string(out), podIP+":53")
	})
}
