package nodetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// startServices makes Services work on the node (Options.Deployments): the API server,
// which listens on loopback only, is forwarded from NodeIP:APIServerPort and published as
// the endpoint of the kubernetes Service (the control plane reconciles no endpoints of its
// own), and kube-proxy programs the Service addresses.
func (n *Node) startServices(ctx context.Context) error {
	u, err := url.Parse(n.Env.Config.Host)
	if err != nil {
		return fmt.Errorf("the API server's address %q: %w", n.Env.Config.Host, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(NodeIP, fmt.Sprint(APIServerPort)))
	if err != nil {
		return fmt.Errorf("the API server's forwarder: %w", err)
	}
	n.forwarder = ln
	go forward(ln, u.Host)

	svcs := n.Env.Client.CoreV1().Services("default")
	if err := n.waitFor(ctx, "the kubernetes Service", time.Minute, func() bool {
		_, err := svcs.Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil
	}); err != nil {
		return err
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes-nodetest", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "nodetest"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{NodeIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(APIServerPort)),
			Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := n.Env.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("publishing the API server's endpoint: %w", err)
	}
	svc, err := svcs.Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if err := n.run(ctx, "start-kube-proxy"); err != nil {
		return err
	}
	// Ready once the kubernetes Service's address is programmed.
	return n.waitFor(ctx, "kube-proxy's rules", time.Minute, func() bool {
		out, err := exec.CommandContext(ctx, "iptables", "-t", "nat", "-S", "KUBE-SERVICES").Output()
		return err == nil && strings.Contains(string(out), svc.Spec.ClusterIP+"/32")
	})
}

// forward copies every connection ln accepts to and from a new connection to target, until
// ln is closed.
func forward(ln net.Listener, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return
		}
		go func() {
			defer c.Close()
			up, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				return
			}
			defer up.Close()
			var wg sync.WaitGroup
			wg.Add(2)
			for _, p := range [][2]net.Conn{{up, c}, {c, up}} {
				go func() {
					defer wg.Done()
					io.Copy(p[0], p[1])
					if tc, ok := p[0].(*net.TCPConn); ok {
						tc.CloseWrite()
					}
				}()
			}
			wg.Wait()
		}()
	}
}
