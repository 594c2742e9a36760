package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/karpenter"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	daemonSetType          = "kubernetes:apps/v1:DaemonSet"
	serviceAccountType     = "kubernetes:core/v1:ServiceAccount"
	clusterRoleType        = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
	clusterRoleBindingType = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"

	testInstallerImage = "registry.example.com/fusebox/node-installer@sha256:3b4c0f5e8a9d2e1f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f"
)

func testInstaller() *NodeInstallerArgs {
	return &NodeInstallerArgs{Image: testInstallerImage}
}

func TestNodeInstallerOnAKS(t *testing.T) {
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: components.AKS, ScheduleOnSandboxNodes: true, NodeInstaller: testInstaller()})
		return err
	})
	m.AssertParented(t, Type)

	ds := m.One(t, daemonSetType)
	p := ds.Props()
	if ns := mocktest.Str(p, "metadata", "namespace"); ns != "kube-system" {
		t.Errorf("DaemonSet in namespace %q, want kube-system (not the sandbox namespace the admission policy guards)", ns)
	}
	spec := mocktest.Dig(p, "spec", "template", "spec")
	if sel, _ := mocktest.Dig(spec, "nodeSelector").(map[string]any); len(sel) != 1 || sel[components.SandboxPoolLabelKey] != components.SandboxPoolLabelValue {
		t.Errorf("nodeSelector %v: want only %s=%s", sel, components.SandboxPoolLabelKey, components.SandboxPoolLabelValue)
	}
	tol := mocktest.Dig(spec, "tolerations", 0)
	if mocktest.Str(tol, "key") != components.SandboxTaintKey || mocktest.Str(tol, "value") != components.SandboxTaintValue ||
		mocktest.Str(tol, "effect") != components.SandboxTaintEffect || mocktest.Str(tol, "operator") != "Equal" {
		t.Errorf("toleration %v does not match the sandbox pool's taint", tol)
	}
	// The AKS NodePool's startup taint is on the node until this pod removes it.
	startup := mocktest.Dig(spec, "tolerations", 1)
	if mocktest.Str(startup, "key") != karpenter.StartupTaintKey || mocktest.Str(startup, "operator") != "Exists" ||
		mocktest.Str(startup, "effect") != karpenter.StartupTaintEffect || mocktest.Dig(spec, "tolerations", 2) != nil {
		t.Errorf("tolerations %v: want the sandbox taint's and the startup taint's only", mocktest.Dig(spec, "tolerations"))
	}
	arch := mocktest.Dig(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0, "matchExpressions", 0)
	if mocktest.Str(arch, "key") != "kubernetes.io/arch" || mocktest.Str(arch, "values", 0) != "amd64" ||
		mocktest.Str(arch, "values", 1) != "arm64" || mocktest.Dig(arch, "values", 2) != nil {
		t.Errorf("architecture affinity %v: want gVisor's architectures, amd64 and arm64", arch)
	}
	if hp, _ := mocktest.Dig(spec, "hostPID").(bool); !hp {
		t.Error("no hostPID: nsenter cannot reach the host's containerd")
	}
	if mocktest.Str(spec, "serviceAccountName") != InstallerName {
		t.Errorf("serviceAccountName %q", mocktest.Str(spec, "serviceAccountName"))
	}
	c := mocktest.Dig(spec, "containers", 0)
	if img := mocktest.Str(c, "image"); img != testInstallerImage || components.ValidateImage(img) != nil {
		t.Errorf("image %q: want the configured digest-pinned image", img)
	}
	if pr, _ := mocktest.Dig(c, "securityContext", "privileged").(bool); !pr {
		t.Error("installer container is not privileged")
	}
	if mocktest.Str(c, "command", 0) != "/bin/bash" || mocktest.Str(c, "command", 2) != InstallerScript {
		t.Errorf("command %v: want bash running the embedded script", mocktest.Dig(c, "command", 0))
	}
	if mocktest.Str(spec, "volumes", 0, "hostPath", "path") != "/" || mocktest.Str(c, "volumeMounts", 0, "mountPath") != hostRoot {
		t.Errorf("host root not mounted at %s: %v", hostRoot, mocktest.Dig(spec, "volumes"))
	}
	env := map[string]any{}
	for _, e := range mocktest.Dig(c, "env").([]any) {
		env[mocktest.Str(e, "name")] = e
	}
	for name, want := range map[string]string{
		"MODE":          "install",
		"HOST_ROOT":     hostRoot,
		"READY_LABEL":   ReadyLabelKey,
		"STARTUP_TAINT": karpenter.StartupTaintKey,
	} {
		if got := mocktest.Str(env[name], "value"); got != want {
			t.Errorf("env %s = %q, want %q", name, got, want)
		}
	}
	// The binaries come from the image, pinned by its digest: no download, no digests.
	for name := range env {
		if strings.HasPrefix(name, "SHA256_") || name == "BINARY_BASE_URL" || name == "IMAGE_BIN_DIR" {
			t.Errorf("env %s: the installer takes its binaries and their digests from its image", name)
		}
	}
	if mocktest.Str(env["NODE_NAME"], "valueFrom", "fieldRef", "fieldPath") != "spec.nodeName" {
		t.Errorf("NODE_NAME %v", env["NODE_NAME"])
	}

	// Least privilege: read, untaint and label nodes, nothing else.
	rules := mocktest.Dig(m.One(t, clusterRoleType).Props(), "rules").([]any)
	if len(rules) != 1 || mocktest.Str(rules[0], "resources", 0) != "nodes" || mocktest.Dig(rules[0], "resources", 1) != nil ||
		strings.Join([]string{mocktest.Str(rules[0], "verbs", 0), mocktest.Str(rules[0], "verbs", 1)}, ",") != "get,patch" ||
		mocktest.Dig(rules[0], "verbs", 2) != nil {
		t.Errorf("ClusterRole rules %v: want get and patch on nodes only", rules)
	}
	b := m.One(t, clusterRoleBindingType).Props()
	if mocktest.Str(b, "subjects", 0, "name") != InstallerName || mocktest.Str(b, "subjects", 0, "namespace") != "kube-system" ||
		mocktest.Str(b, "roleRef", "name") != InstallerName {
		t.Errorf("ClusterRoleBinding %v", b)
	}
	if sa := m.One(t, serviceAccountType).Props(); mocktest.Str(sa, "metadata", "namespace") != "kube-system" {
		t.Errorf("ServiceAccount %v", sa)
	}
}

func TestNodeInstallerPerCloud(t *testing.T) {
	for _, cloud := range []components.Cloud{components.GKE, components.Local} {
		t.Run(string(cloud), func(t *testing.T) {
			m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
				_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: cloud})
				return err
			})
			for _, typ := range []string{daemonSetType, serviceAccountType, clusterRoleType, clusterRoleBindingType} {
				if n := len(m.ByType(typ)); n != 0 {
					t.Errorf("%d %s on %s", n, typ, cloud)
				}
			}
			_, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: cloud, NodeInstaller: testInstaller()})
				return err
			})
			if !errors.Is(err, ErrBadInstaller) {
				t.Errorf("node installer on %s: want ErrBadInstaller, got %v", cloud, err)
			}
		})
	}
	// EKS: only a verify-only installer (the userData installs); it downloads nothing and
	// carries the pull secrets.
	for name, ni := range map[string]*NodeInstallerArgs{"none": nil, "installing": testInstaller()} {
		_, err := mocktest.Run(func(ctx *pulumi.Context) error {
			_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: components.EKS, NodeInstaller: ni})
			return err
		})
		if !errors.Is(err, ErrBadInstaller) {
			t.Errorf("eks, %s installer: want ErrBadInstaller, got %v", name, err)
		}
	}
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: components.EKS, ScheduleOnSandboxNodes: true,
			NodeInstaller: &NodeInstallerArgs{Image: testInstaller().Image, VerifyOnly: true, ImagePullSecrets: []string{"regcred"}}})
		return err
	})
	pod := mocktest.Dig(m.One(t, daemonSetType).Props(), "spec", "template", "spec")
	env := map[string]string{}
	for _, e := range mocktest.Dig(pod, "containers", 0, "env").([]any) {
		env[mocktest.Str(e, "name")] = mocktest.Str(e, "value")
	}
	if env["MODE"] != "verify" || mocktest.Str(pod, "imagePullSecrets", 0, "name") != "regcred" {
		t.Errorf("EKS installer env %v, pull secrets %v", env, mocktest.Dig(pod, "imagePullSecrets"))
	}
}

func TestNodeInstallerRefusesBadSettings(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*NodeInstallerArgs)
		want error
	}{
		"none":         {nil, ErrBadInstaller},
		"image by tag": {func(a *NodeInstallerArgs) { a.Image = "registry.example.com/installer:v1" }, components.ErrImageNotPinned},
		"no image":     {func(a *NodeInstallerArgs) { a.Image = "" }, ErrBadInstaller},
		"verify-only":  {func(a *NodeInstallerArgs) { a.VerifyOnly = true }, ErrBadInstaller},
	} {
		t.Run(name, func(t *testing.T) {
			args := &GVisorArgs{Cloud: components.AKS}
			if tc.mut != nil {
				args.NodeInstaller = testInstaller()
				tc.mut(args.NodeInstaller)
			}
			m, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewGVisor(ctx, "fb", args)
				return err
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("want %v, got %v", tc.want, err)
			}
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered despite bad settings", n)
			}
		})
	}
}

// writeScript writes the embedded installer to a file for bash.
func writeScript(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	p := filepath.Join(t.TempDir(), "node-installer.sh")
	if err := os.WriteFile(p, []byte(InstallerScript), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeNodeAPI is the part of the API server the installer uses: GET and PATCH of one node,
// with JSON patches (the test and remove operations of RFC 6902, which the installer sends)
// and merge patches. A failed test operation is refused with 422, like the API server does.
// GET answers indented, as the API server answers curl's user agent.
type fakeNodeAPI struct {
	t *testing.T

	mu sync.Mutex // guards the fields below
	// node is the node object, as decoded JSON.
	node map[string]any
	// requests are the requests served, "METHOD content-type body -> status".
	requests []string
	// afterGet, when set, changes the node after the next GET (another controller racing
	// the installer) and is then cleared.
	afterGet func(node map[string]any)
}

func (f *fakeNodeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	ctype := r.Header.Get("Content-Type")
	status, resp := f.serve(r.Method, r.URL.Path, r.Header.Get("Authorization"), ctype, body)
	req := slices.DeleteFunc([]string{r.Method, ctype, string(body)}, func(s string) bool { return s == "" })
	f.requests = append(f.requests, fmt.Sprintf("%s -> %d", strings.Join(req, " "), status))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(resp)
}

func (f *fakeNodeAPI) serve(method, path, auth, ctype string, body []byte) (int, []byte) {
	switch {
	case auth != "Bearer tok":
		return http.StatusUnauthorized, nil
	case path != "/api/v1/nodes/node-1":
		return http.StatusNotFound, nil
	case method == http.MethodGet:
		out, _ := json.MarshalIndent(f.node, "", "  ")
		if f.afterGet != nil {
			f.afterGet(f.node)
			f.afterGet = nil
		}
		return http.StatusOK, out
	case method != http.MethodPatch:
		return http.StatusMethodNotAllowed, nil
	}
	// Patch a copy: a patch applies whole or not at all.
	var node any
	b, _ := json.Marshal(f.node)
	json.Unmarshal(b, &node)
	switch ctype {
	case "application/merge-patch+json":
		var patch any
		if err := json.Unmarshal(body, &patch); err != nil {
			return http.StatusBadRequest, nil
		}
		node = mergePatch(node, patch)
	case "application/json-patch+json":
		var ops []struct {
			Op, Path string
			Value    any
		}
		if err := json.Unmarshal(body, &ops); err != nil {
			return http.StatusBadRequest, nil
		}
		for _, op := range ops {
			var err error
			if node, err = applyOp(node, op.Op, strings.Split(strings.TrimPrefix(op.Path, "/"), "/"), op.Value); err != nil {
				f.t.Logf("JSON patch %s %s: %v", op.Op, op.Path, err)
				return http.StatusUnprocessableEntity, nil
			}
		}
	default:
		return http.StatusUnsupportedMediaType, nil
	}
	f.node = node.(map[string]any)
	out, _ := json.Marshal(f.node)
	return http.StatusOK, out
}

// applyOp applies a JSON patch test or remove operation at the JSON pointer path to doc and
// returns the new document.
func applyOp(doc any, op string, path []string, value any) (any, error) {
	if len(path) == 0 {
		if op == "test" && reflect.DeepEqual(doc, value) {
			return doc, nil
		}
		return nil, fmt.Errorf("test failed: %v is not %v", doc, value)
	}
	last := len(path) == 1 && op == "remove"
	switch d := doc.(type) {
	case map[string]any:
		child, ok := d[path[0]]
		if !ok {
			return nil, fmt.Errorf("no member %q", path[0])
		}
		if last {
			delete(d, path[0])
			return d, nil
		}
		child, err := applyOp(child, op, path[1:], value)
		d[path[0]] = child
		return d, err
	case []any:
		i, err := strconv.Atoi(path[0])
		if err != nil || i < 0 || i >= len(d) {
			return nil, fmt.Errorf("no index %q in an array of %d", path[0], len(d))
		}
		if last {
			return slices.Delete(d, i, i+1), nil
		}
		d[i], err = applyOp(d[i], op, path[1:], value)
		return d, err
	}
	return nil, fmt.Errorf("%q: not an object or array", path[0])
}

// mergePatch applies an RFC 7386 merge patch.
func mergePatch(doc, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	d, ok := doc.(map[string]any)
	if !ok {
		d = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(d, k)
		} else {
			d[k] = mergePatch(d[k], v)
		}
	}
	return d
}

// Taints of a fresh AKS sandbox node: the cloud provider's until it has initialised the node,
// the pool's, the startup taint and the node lifecycle controller's.
var (
	uninitializedTaint = map[string]any{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}
	sandboxTaint       = map[string]any{"key": "fusebox.dev/sandbox", "value": "true", "effect": "NoSchedule"}
	startupTaint       = map[string]any{"key": karpenter.StartupTaintKey, "effect": "NoSchedule"}
	notReadyTaint      = map[string]any{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": "2026-11-30T18:00:00Z"}
)

func testNode() map[string]any {
	var node map[string]any
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{
			"name":   "node-1",
			"labels": map[string]any{"fusebox.dev/pool": "sandbox"},
			// A "taints" key inside a string, before spec: not the node's taints.
			"annotations": map[string]any{"example.com/copy": `{"spec":{"taints":[{"key":"fusebox.dev/gvisor-not-ready","effect":"NoSchedule"}]}}`},
			"managedFields": []any{map[string]any{"manager": "karpenter", "fieldsType": "FieldsV1",
				"fieldsV1": map[string]any{"f:spec": map[string]any{"f:taints": map[string]any{}}}}},
		},
		"spec": map[string]any{"taints": []any{uninitializedTaint, sandboxTaint, startupTaint, notReadyTaint}},
	})
	json.Unmarshal(b, &node)
	return node
}

// TestInstallerMain runs the whole script with stand-ins for nsenter, sleep and curl (passing
// requests to the API server on to the real curl, for a fakeNodeAPI, and logging any other),
// with the image's binaries and their recorded digests in a directory, and checks what it
// installs and when it removes the startup taint and labels the node.
func TestInstallerMain(t *testing.T) {
	script := writeScript(t)
	realCurl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	api := &fakeNodeAPI{t: t, node: testNode()}
	srv := httptest.NewTLSServer(api)
	defer srv.Close()
	srvURL, _ := url.Parse(srv.URL)

	dir := t.TempDir()
	root, imageBin, stubs, sa := filepath.Join(dir, "host"), filepath.Join(dir, "opt-gvisor"), filepath.Join(dir, "bin"), filepath.Join(dir, "sa")
	log := filepath.Join(dir, "calls.log")
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	files := map[string]string{
		filepath.Join(root, "etc/containerd/config.toml"):   aksConfigV2,
		filepath.Join(imageBin, "runsc"):                    "runsc binary\n",
		filepath.Join(imageBin, "containerd-shim-runsc-v1"): "shim binary\n",
		filepath.Join(imageBin, "SHA256SUMS"):               sum("runsc binary\n") + "  runsc\n" + sum("shim binary\n") + "  containerd-shim-runsc-v1\n",
		filepath.Join(sa, "token"):                          "tok",
		filepath.Join(sa, "ca.crt"):                         string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})),
		filepath.Join(stubs, "sleep"):                       "#!/bin/bash\nexit 0\n",
		filepath.Join(stubs, "nsenter"):                     "#!/bin/bash\necho \"nsenter $*\" >>\"$FAKE_LOG\"\n",
		filepath.Join(stubs, "curl"): `#!/bin/bash
url=
for a in "$@"; do [[ $a == http* ]] && url=$a; done
echo "curl $url" >>"$FAKE_LOG"
[[ $url == "$FAKE_API"/* ]] || exit 7
exec "$REAL_CURL" "$@"
`,
	}
	write := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, content := range files {
		write(p, content)
	}
	// run runs the script and returns the stand-ins' calls and the API requests it made.
	run := func() (calls string, requests []string, err error) {
		os.Remove(log)
		api.mu.Lock()
		api.requests = nil
		api.mu.Unlock()
		cmd := exec.Command("bash", script)
		cmd.Env = append(os.Environ(),
			"PATH="+stubs+":"+os.Getenv("PATH"), "REAL_CURL="+realCurl, "NO_PROXY=*", "no_proxy=*",
			"FAKE_LOG="+log, "FAKE_API="+srv.URL, "IMAGE_BIN_DIR="+imageBin,
			"NODE_NAME=node-1", "HOST_ROOT="+root, "SA_DIR="+sa,
			"READY_FILE="+filepath.Join(dir, "ready"), "READY_LABEL="+ReadyLabelKey, "STARTUP_TAINT="+karpenter.StartupTaintKey,
			"KUBERNETES_SERVICE_HOST="+srvURL.Hostname(), "KUBERNETES_SERVICE_PORT="+srvURL.Port())
		out, err := cmd.CombinedOutput()
		b, _ := os.ReadFile(log)
		t.Logf("output:\n%s", out)
		api.mu.Lock()
		defer api.mu.Unlock()
		return string(b), slices.Clone(api.requests), err
	}
	taints := func() []any {
		api.mu.Lock()
		defer api.mu.Unlock()
		ts, _ := mocktest.Dig(api.node, "spec", "taints").([]any)
		return ts
	}
	removeAt := func(i int) string {
		return fmt.Sprintf(`PATCH application/json-patch+json [{"op":"test","path":"/spec/taints/%d/key","value":"%s"},`+
			`{"op":"test","path":"/spec/taints/%d/effect","value":"NoSchedule"},{"op":"remove","path":"/spec/taints/%d"}]`,
			i, karpenter.StartupTaintKey, i, i)
	}
	const (
		get   = "GET -> 200"
		label = `PATCH application/merge-patch+json {"metadata":{"labels":{"fusebox.dev/gvisor":"ready"}}} -> 200`
	)
	restart := "nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd"

	// A shim in the image that is not the one whose digest the image build recorded (the
	// runsc is): nothing installed, not even the good runsc, no restart, and the node keeps
	// its startup taint and gets no label. Then a SHA256SUMS without the shim's line.
	for _, tamper := range []struct{ name, content string }{
		{"containerd-shim-runsc-v1", "another shim\n"},
		{"SHA256SUMS", sum("runsc binary\n") + "  runsc\n"},
	} {
		good := files[filepath.Join(imageBin, tamper.name)]
		write(filepath.Join(imageBin, tamper.name), tamper.content)
		calls, reqs, err := run()
		if err == nil {
			t.Fatalf("the script installed from an image whose %s was changed", tamper.name)
		}
		for _, bin := range []string{"runsc", "containerd-shim-runsc-v1"} {
			if _, err := os.Stat(filepath.Join(root, "usr/local/bin", bin)); err == nil {
				t.Errorf("%s installed although the image's %s was changed", bin, tamper.name)
			}
		}
		if strings.Contains(calls, "nsenter") || len(reqs) != 0 {
			t.Errorf("restart or API requests after a failed verification:\n%s\n%s", calls, strings.Join(reqs, "\n"))
		}
		if ts := taints(); !slices.ContainsFunc(ts, func(v any) bool { return reflect.DeepEqual(v, startupTaint) }) {
			t.Errorf("startup taint gone after a failed install: %v", ts)
		}
		write(filepath.Join(imageBin, tamper.name), good)
	}

	// The install. Between the installer's read of the node and its patch, the cloud provider
	// removes its own taint, so the startup taint moves from index 2 to 1: the patch for index
	// 2 must be refused (its test fails) and the installer must read the node again.
	api.mu.Lock()
	api.afterGet = func(node map[string]any) {
		spec := node["spec"].(map[string]any)
		spec["taints"] = spec["taints"].([]any)[1:]
	}
	api.mu.Unlock()
	calls, reqs, err := run()
	if err != nil {
		t.Fatalf("install: %v\n%s", err, calls)
	}
	for bin, want := range map[string]string{"runsc": "runsc binary\n", "containerd-shim-runsc-v1": "shim binary\n"} {
		p := filepath.Join(root, "usr/local/bin", bin)
		b, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if err != nil || string(b) != want || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %q %v", bin, b, err)
		}
	}
	want := []string{get, removeAt(2) + " -> 422", get, removeAt(1) + " -> 200", get, label}
	if !slices.Equal(reqs, want) {
		t.Errorf("API requests:\n%s\nwant:\n%s", strings.Join(reqs, "\n"), strings.Join(want, "\n"))
	}
	if strings.Count(calls, restart) != 1 {
		t.Errorf("want one containerd restart:\n%s", calls)
	}
	if i, j := strings.Index(calls, restart), strings.Index(calls, "curl "+srv.URL); i < 0 || j < 0 || i > j {
		t.Errorf("node untainted or labelled before containerd was restarted:\n%s", calls)
	}
	// Only the startup taint removed; the others, with all their fields, left.
	if ts := taints(); !reflect.DeepEqual(ts, []any{sandboxTaint, notReadyTaint}) {
		t.Errorf("taints after the install: %v", ts)
	}
	api.mu.Lock()
	if l := mocktest.Str(api.node, "metadata", "labels", ReadyLabelKey); l != ReadyLabelValue {
		t.Errorf("label %s=%q", ReadyLabelKey, l)
	}
	if !reflect.DeepEqual(api.node["metadata"].(map[string]any)["annotations"], testNode()["metadata"].(map[string]any)["annotations"]) {
		t.Errorf("annotations changed: %v", api.node["metadata"])
	}
	api.mu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "ready")); err != nil {
		t.Errorf("ready file: %v", err)
	}
	cfg, _ := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml"))
	if strings.Count(string(cfg), "runtimes.runsc]") != 1 {
		t.Errorf("config:\n%s", cfg)
	}

	// Nothing but the API server was asked for anything: no download.
	if strings.Contains(calls, "curl ") && strings.Count(calls, "curl ") != strings.Count(calls, "curl "+srv.URL+"/") {
		t.Errorf("requests to other than the API server:\n%s", calls)
	}

	// A restarted pod: everything is in place, so no copy (the installed files keep their
	// inodes), no restart and no taint to remove; label again.
	inode := func(bin string) uint64 {
		fi, err := os.Stat(filepath.Join(root, "usr/local/bin", bin))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	runscIno, shimIno := inode("runsc"), inode("containerd-shim-runsc-v1")
	calls, reqs, err = run()
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if strings.Contains(calls, "nsenter") || inode("runsc") != runscIno || inode("containerd-shim-runsc-v1") != shimIno {
		t.Errorf("second run installed or restarted:\n%s", calls)
	}
	if want := []string{get, label}; !slices.Equal(reqs, want) {
		t.Errorf("second run's API requests:\n%s\nwant:\n%s", strings.Join(reqs, "\n"), strings.Join(want, "\n"))
	}
}

// TestStartupTaintIndex checks how the script finds the startup taint in a node's JSON, compact
// (as the API server answers other clients) or indented (as it answers curl).
func TestStartupTaintIndex(t *testing.T) {
	script := writeScript(t)
	const key = karpenter.StartupTaintKey
	for _, tc := range []struct {
		name, node, want string
	}{
		{"first", `{"spec":{"taints":[{"key":"` + key + `","effect":"NoSchedule"},{"key":"a","effect":"NoSchedule"}]}}`, "0"},
		{"indented", "{\n  \"spec\": {\n    \"taints\": [\n      {\n        \"effect\": \"NoExecute\",\n        \"key\": \"a\"\n      },\n" +
			"      {\n        \"effect\": \"NoSchedule\",\n        \"key\": \"" + key + "\"\n      }\n    ]\n  }\n}", "1"},
		{"with value and time", `{"spec":{"taints":[{"key":"a","value":"b","effect":"NoSchedule"},{"key":"` + key + `","value":"x","effect":"NoSchedule","timeAdded":"2026-11-30T18:00:00Z"}]}}`, "1"},
		{"no taints", `{"metadata":{"name":"n"},"spec":{"podCIDR":"10.0.0.0/24"}}`, ""},
		{"empty taints", `{"spec":{"taints":[]}}`, ""},
		{"other effect", `{"spec":{"taints":[{"key":"` + key + `","effect":"NoExecute"}]}}`, ""},
		{"longer key", `{"spec":{"taints":[{"key":"` + key + `-x","effect":"NoSchedule"},{"key":"x` + key + `","effect":"NoSchedule"}]}}`, ""},
		{"only in a string", `{"metadata":{"annotations":{"a":"{\"taints\":[{\"key\":\"` + key + `\",\"effect\":\"NoSchedule\"}]}"},` +
			`"managedFields":[{"fieldsV1":{"f:spec":{"f:taints":{}}}}]},"spec":{"taints":[{"key":"a","effect":"NoSchedule"}]}}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("bash", "-c", `source "$1" && startup_taint_index "$2"`, "bash", script, tc.node)
			cmd.Env = append(os.Environ(), "FUSEBOX_INSTALLER_LIB=1", "STARTUP_TAINT="+key)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Errorf("index %q, want %q", got, tc.want)
			}
		})
	}
}

// TestVerifyAndSystemdCgroup: the EKS (verify-only) mode passes only when runsc and its shim
// are installed and containerd's running configuration has the runsc runtime; runsc's flags
// say systemd-cgroup where the kubelet uses the systemd cgroup driver.
func TestVerifyAndSystemdCgroup(t *testing.T) {
	script := writeScript(t)
	dir := t.TempDir()
	root, stubs := filepath.Join(dir, "host"), filepath.Join(dir, "bin")
	write := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// nsenter stands in for the host's containerd: it prints $FAKE_DUMP for `config dump`.
	write(filepath.Join(stubs, "nsenter"), "#!/bin/bash\n[[ \" $* \" == *' config dump '* ]] && cat \"$FAKE_DUMP\"\nexit 0\n")
	dump := filepath.Join(dir, "dump.toml")
	run := func(fn string) (string, error) {
		cmd := exec.Command("bash", "-c", `source "$1" && `+fn, "bash", script)
		cmd.Env = append(os.Environ(), "FUSEBOX_INSTALLER_LIB=1", "HOST_ROOT="+root, "PATH="+stubs+":"+os.Getenv("PATH"), "FAKE_DUMP="+dump)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	write(dump, "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n")
	if out, err := run("verify_installed"); err == nil || !strings.Contains(out, "runsc is not installed") {
		t.Errorf("verify without binaries: %v %s", err, out)
	}
	write(filepath.Join(root, "usr/local/bin/runsc"), "x")
	write(filepath.Join(root, "usr/local/bin/containerd-shim-runsc-v1"), "x")
	if out, err := run("verify_installed"); err == nil || !strings.Contains(out, "no runsc runtime") {
		t.Errorf("verify without the runtime registered: %v %s", err, out)
	}
	write(dump, "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]\n  runtime_type = 'io.containerd.runsc.v1'\n")
	if out, err := run("verify_installed"); err != nil {
		t.Errorf("verify with runsc registered: %v %s", err, out)
	}

	for _, tc := range []struct {
		kubelet, want string
	}{
		{"", "false"},
		{"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n", "true"},
		{"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\n", "false"},
	} {
		os.Remove(filepath.Join(root, "var/lib/kubelet/config.yaml"))
		os.Remove(filepath.Join(root, "etc/containerd/runsc.toml"))
		if tc.kubelet != "" {
			write(filepath.Join(root, "var/lib/kubelet/config.yaml"), tc.kubelet)
		}
		if out, err := run("runsc_config"); err != nil || strings.TrimSpace(out) != "changed" {
			t.Fatalf("runsc_config: %v %s", err, out)
		}
		b, _ := os.ReadFile(filepath.Join(root, "etc/containerd/runsc.toml"))
		if !strings.Contains(string(b), `systemd-cgroup = "`+tc.want+`"`) || !strings.Contains(string(b), "[runsc_config]") {
			t.Errorf("kubelet %q: runsc.toml\n%s", tc.kubelet, b)
		}
	}
}

// TestInstallerTimeouts: Pulumi waits for the installer DaemonSet for InstallerTimeouts, sized
// for an update that rolls it node by node (docs/deploy.md), not the provider's 10 minutes.
func TestInstallerTimeouts(t *testing.T) {
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: components.AKS, ScheduleOnSandboxNodes: true, NodeInstaller: testInstaller()})
		return err
	})
	got := m.One(t, daemonSetType).Timeouts
	if got == nil || *got != (mocktest.Timeouts{Create: "15m", Update: "30m", Delete: "10m"}) {
		t.Errorf("installer DaemonSet customTimeouts %+v", got)
	}
}
