package clusterup

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/infra/deploy"
	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

// strangerAccess is the fusebox:access of the second up: the default rule's callers (the
// stack's dataClientNamespaces) and, new, ServiceAccount elsewhere/stranger.
const strangerAccess = "  fusebox:access:\n    - namespaces: [default]\n    - serviceAccounts: [elsewhere/stranger]\n"

// upgrade runs a second `fusebox up` over the deployment, as a platform team promoting a
// release does: the sandbox image is a new release (another digest), fusebox:access now
// lets elsewhere/stranger allocate, a change of the manager's policy ConfigMap alone, and
// the agents' data port is open to namespace elsewhere too, a change of a namespace
// policy's spec. Then the change of access is enforced (the manager rolled onto it), the
// warm pods of the old image are all replaced by pods of the new one, bound, a sandbox bound
// before the up, still serves from its old-image pod, and every namespace policy was updated
// in place: the same object (UID) throughout, so no moment without it. (The Kubernetes
// provider replaces a NetworkPolicy or CiliumNetworkPolicy only when its name or namespace
// changes, and then creates the new one before it deletes the old.)
func upgrade(ctx context.Context, t *testing.T, d *deployment, bound *client.Allocation) {
	t.Helper()
	oldImage := d.release[image.Sandbox]
	newImage := newSandboxRelease(ctx, t, d)
	release := infra.ReleaseImages{}
	for k, v := range d.release {
		release[k] = v
	}
	release[image.Sandbox] = newImage
	stack, err := stackFile(release, existingNamespaces+strangerAccess)
	if err != nil {
		t.Fatal(err)
	}
	const clients, moreClients = "dataClientNamespaces: [default]", "dataClientNamespaces: [default, elsewhere]"
	if !bytes.Contains(stack, []byte(clients)) {
		t.Fatalf("the stack file has no %q to change", clients)
	}
	stack = bytes.Replace(stack, []byte(clients), []byte(moreClients), 1)
	policies := func() map[string]networkingv1.NetworkPolicy {
		t.Helper()
		l, err := node.Env.Client.NetworkingV1().NetworkPolicies(d.sandboxNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]networkingv1.NetworkPolicy{}
		for _, p := range l.Items {
			m[p.Name] = p
		}
		return m
	}
	before := policies()
	writeFile(t, filepath.Join(d.opts.RepoDir, "stacks", "Pulumi.local.yaml"), string(stack))
	d.progress.Reset()
	start := time.Now()
	res, err := deploy.Run(ctx, deploy.Up, d.opts)
	if err != nil {
		t.Fatalf("the second up: %v\n%s\n%s", err, d.progress.String(), clusterState(ctx))
	}
	t.Logf("the second up took %s: %v", time.Since(start).Round(time.Second), res.Changes)

	// The namespace's policies are the same objects, one of them with the new spec.
	after := policies()
	for name, p := range before {
		if a, ok := after[name]; !ok || a.UID != p.UID {
			t.Errorf("NetworkPolicy %s was replaced by the second up (UID %s, now %s): the namespace was without it for a moment", name, p.UID, a.UID)
		}
	}
	agents, ok := after[sandboxnet.AllowAgentsDataName]
	if !ok || !strings.Contains(fmt.Sprint(agents.Spec.Ingress), "elsewhere") {
		t.Errorf("NetworkPolicy %s after the second up does not admit namespace elsewhere: %+v", sandboxnet.AllowAgentsDataName, agents.Spec.Ingress)
	}

	// The bound sandbox kept its pod, its image and its agent through the rollout.
	boundPod, err := node.Env.Client.CoreV1().Pods(d.sandboxNS).Get(ctx, bound.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox bound before the up: %v", err)
	}
	if got := sandboxImage(boundPod); got != oldImage {
		t.Fatalf("the bound sandbox's pod runs %s, want the old release %s", got, oldImage)
	}
	if _, err := bound.Sandbox.Run(ctx, "true"); err != nil {
		t.Fatalf("the sandbox bound before the up stopped serving: %v", err)
	}

	// The new access rule is enforced: the stranger allocates, and gets the new image.
	stranger := d.agent
	stranger.TokenFile = filepath.Join(t.TempDir(), "stranger-token")
	writeFile(t, stranger.TokenFile, mustToken(ctx, t, "elsewhere", "stranger", manager.DefaultTokenAudience))
	// As an agent would, it retries while the Service's address still leads to a replica the
	// rollout stopped (kube-proxy follows the endpoints a moment later).
	var a *client.Allocation
	for deadline := time.Now().Add(2 * time.Minute); ; {
		a, err = client.Allocate(ctx, d.addr, stranger)
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		t.Fatalf("the ServiceAccount the second up allows: %v\n%s", err, clusterState(ctx))
	}
	defer a.Close()
	if _, err := a.Sandbox.Run(ctx, "true"); err != nil {
		t.Fatal(err)
	}
	pod, err := node.Env.Client.CoreV1().Pods(d.sandboxNS).Get(ctx, a.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := sandboxImage(pod); got != newImage {
		t.Fatalf("a sandbox allocated after the up runs %s, want the new release %s", got, newImage)
	}

	// The warm pool holds only new-image pods once the leader has drained the old ones (at
	// once for a pool an earlier leader made, after the claim grace for pods an old replica
	// made during the rollout) and refilled.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var old, fresh []string
		for _, p := range readySandboxPods(ctx, t, d.sandboxNS) {
			if p.Name == bound.ID || p.Name == a.ID {
				continue
			}
			if sandboxImage(&p) == newImage {
				fresh = append(fresh, p.Name)
			} else {
				old = append(old, p.Name)
			}
		}
		if len(old) == 0 && len(fresh) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the up, warm pods of the old image %v, of the new %v: want none and some\n%s", old, fresh, clusterState(ctx))
		}
		time.Sleep(2 * time.Second)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("releasing the stranger's sandbox: %v", err)
	}
}

// sandboxImage is the image of a sandbox pod's server container.
func sandboxImage(p *corev1.Pod) string {
	if len(p.Spec.Containers) == 0 {
		return ""
	}
	return p.Spec.Containers[0].Image
}

// newSandboxRelease makes a new release of the sandbox image, as a rebuild with a fix would:
// the same image with one more config label, so another digest. It imports it into the node
// and names it as the stack will pin it (registry/sandbox@digest), and returns that name.
func newSandboxRelease(ctx context.Context, t *testing.T, d *deployment) string {
	t.Helper()
	img, err := image.Load(d.built[image.Sandbox].Dir)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config
	cfg.Labels = map[string]string{"dev.fusebox.test/release": "2"}
	for k, v := range cf.Config.Labels {
		cfg.Labels[k] = v
	}
	next, err := mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const ref = "localhost/fusebox-test/sandbox:release-2"
	archive := filepath.Join(t.TempDir(), "sandbox-2.tar")
	if err := nodetest.WriteImage(next, ref, archive); err != nil {
		t.Fatal(err)
	}
	if err := node.Import(ctx, archive); err != nil {
		t.Fatal(err)
	}
	digest, err := node.ImageDigest(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	pinned := registry + "/" + image.Sandbox + "@" + digest
	if pinned == d.release[image.Sandbox] {
		t.Fatalf("the new release has the old digest %s", digest)
	}
	if err := node.Tag(ctx, ref, pinned); err != nil {
		t.Fatal(err)
	}
	return pinned
}
