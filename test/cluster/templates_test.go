package cluster_test

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/clustertest"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

// TestTemplateImageOnARealNode: a template's pods run its image, which holds nothing of
// fusebox, under gVisor, with the sandbox server copied in from the sandbox image by an init
// container and run from a read-only volume; commands run as the template's user (a name the
// server looks up in the image's /etc/passwd), in the image's environment under the
// template's and the allocation's, in the template's working directory, after its warm-up.
// A template whose image cannot be pulled fails its own pool, saying so, while the others
// serve.
func TestTemplateImageOnARealNode(t *testing.T) {
	n := realNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The template's image: Debian's userland alone, with an environment of its own.
	img, err := imagetest.PlainImage(v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "FROM_IMAGE=image"}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "plain.tar")
	if err := nodetest.WriteImage(img, "localhost/fusebox-test/plain:v1", archive); err != nil {
		t.Fatal(err)
	}
	if err := n.Import(ctx, archive); err != nil {
		t.Fatal(err)
	}
	ref := "localhost/fusebox-test/plain@" + digest.String()
	if err := n.Tag(ctx, "localhost/fusebox-test/plain:v1", ref); err != nil {
		t.Fatal(err)
	}
	base := kubealloc.DefaultTemplate(clustertest.SandboxImage)
	// Small CPU requests: the node's 2 CPUs also hold the pods of the tests before this one,
	// still terminating, and a pod it cannot fit is rejected (OutOfcpu) before any pull.
	small := templates.Limits{CPU: "50m"}
	plain, err := kubealloc.FromSpec(templates.Spec{Name: "plain", Image: ref, User: "nobody", Cwd: "/usr", Limits: small,
		Env:    map[string]string{"FROM_TEMPLATE": "template"},
		WarmUp: []templates.Command{{Script: "echo warm > /workspace/warm"}}}, base)
	if err != nil {
		t.Fatal(err)
	}
	missing, err := kubealloc.FromSpec(templates.Spec{Name: "missing", Limits: small,
		Image: "localhost/fusebox-test/missing@sha256:" + strings.Repeat("0", 64)}, base)
	if err != nil {
		t.Fatal(err)
	}
	m, _, ns := clustertest.NewManagerWith(t, n, sandboxnet.Kubernetes, map[string]kubealloc.Template{"plain": plain, "missing": missing})

	key, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	al := clustertest.AllocateRequest(t, ctx, n, m, key, manager.AllocateRequest{Template: "plain",
		Env: map[string]string{"FROM_ALLOCATION": "allocation"}})
	sb, err := client.Dial(al.Endpoint, al.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Run(ctx, "sh", "-c", `id -un; pwd; echo "$FROM_IMAGE $FROM_TEMPLATE $FROM_ALLOCATION"; cat /workspace/warm; env | grep -c '^KUBERNETES_'; cat /proc/version`)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(res.Stdout), "\n")
	if len(lines) < 6 || lines[0] != "nobody" || lines[1] != "/usr" || lines[2] != "image template allocation" || lines[3] != "warm" || lines[4] != "0" ||
		!strings.Contains(strings.ToLower(lines[5]), "gvisor") {
		t.Fatalf("in the template's sandbox: %q (stderr %q), want user nobody, cwd /usr, the three environments, the warm-up's file, no KUBERNETES_ variables, gVisor", res.Stdout, res.Stderr)
	}
	res, err = sb.Run(ctx, "sh", "-c", "echo x > /fusebox/fusebox-sandbox")
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 {
		t.Error("a command replaced the sandbox server's binary")
	}
	pod, err := n.Env.Client.CoreV1().Pods(ns).Get(ctx, al.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := pod.Spec.Containers[0]; c.Image != ref || *pod.Spec.RuntimeClassName != "gvisor" ||
		len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Image != clustertest.SandboxImage {
		t.Errorf("pod runs %s under %s, init containers %+v", c.Image, *pod.Spec.RuntimeClassName, pod.Spec.InitContainers)
	}

	// The template whose image is nowhere fails its own pool, naming the image's trouble.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var st manager.TemplateStatus
		for _, p := range m.Status().Pools {
			if p.Template == "missing" {
				st = p
			}
		}
		if strings.Contains(st.LastError, "missing@sha256") && (strings.Contains(st.LastError, "ImagePullBackOff") || strings.Contains(st.LastError, "ErrImagePull")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool of a template whose image cannot be pulled: last error %q", st.LastError)
		}
		time.Sleep(time.Second)
	}
	def := clustertest.AllocateRequest(t, ctx, n, m, key, manager.AllocateRequest{})
	if def.ID == "" {
		t.Fatal("the default template allocates nothing beside a failing pool")
	}
}
