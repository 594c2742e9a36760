package deployup

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/test/stacktest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// helmReleaseType is skipped: a Helm release is not an API object but a chart the provider
// renders and installs (Cilium, only in stacks with cilium.install), and its objects are
// Cilium's, not fusebox's.
const helmReleaseType = "kubernetes:helm.sh/v3:Release"

// TestStackObjectsAreValid runs infra.Program for every stack file under recording mocks and
// creates each recorded Kubernetes object, and the manager's sandbox pod template, in the real
// API server with server-side dry run and strict field validation, so the server checks each
// against its schema (the built-in types' and the CRDs' in test/kubetest/crds) and runs its
// admission plugins on it (not fusebox's own admission policy, which is only dry-run created
// here; TestUpLocalStack shows that one at work). The stacks' namespaces are created for real
// first, since namespaced objects need them, and deleted again at the end.
func TestStackObjectsAreValid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	paths, err := filepath.Glob(filepath.Join(testenv.ModuleRoot(), "stacks", "Pulumi.*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("stack files: %v %v", paths, err)
	}
	mapper := restMapper(t)
	namespaces := map[string]bool{} // created for real by this test; deleted at the end
	t.Cleanup(func() { deleteNamespaces(t, namespaces) })

	for _, path := range paths {
		stack := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "Pulumi."), ".yaml")
		t.Run(stack, func(t *testing.T) {
			m, err := mocktest.Run(infra.Program, mocktest.WithConfig(stackConfig(t, path)),
				func(info *pulumi.RunInfo) { info.Stack = stack })
			if err != nil {
				t.Fatalf("Program: %v", err)
			}
			var objs []*unstructured.Unstructured
			for _, r := range m.All() {
				obj, err := toObject(r)
				if err != nil {
					t.Fatalf("%s %s: %v", r.Type, r.Name, err)
				}
				if obj != nil {
					objs = append(objs, obj)
				}
			}
			if len(objs) < 10 {
				t.Fatalf("only %d Kubernetes objects recorded", len(objs))
			}
			// The sandbox pod template is data in a ConfigMap; it becomes a pod in the
			// namespace the admission policy guards, so validate it as one there.
			tmpl, err := templatePod(m)
			if err != nil {
				t.Fatal(err)
			}
			objs = append(objs, tmpl)
			// Namespaces first and for real: the namespaced objects' dry-run creates need them.
			for _, o := range objs {
				if o.GetKind() != "Namespace" || o.GetAPIVersion() != "v1" {
					continue
				}
				_, err := env.Dynamic.Resource(corev1.SchemeGroupVersion.WithResource("namespaces")).
					Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"})
				if err == nil {
					namespaces[o.GetName()] = true
				} else if !apierrors.IsAlreadyExists(err) {
					t.Errorf("Namespace %s refused: %v", o.GetName(), err)
				}
			}

			var refused []string
			for _, o := range objs {
				if err := dryRunCreate(ctx, mapper, o); err != nil {
					refused = append(refused, fmt.Sprintf("%s %s %s/%s: %v",
						o.GetAPIVersion(), o.GetKind(), o.GetNamespace(), o.GetName(), err))
				}
			}
			t.Logf("%d objects of stack %s validated", len(objs)-len(refused), stack)
			if len(refused) > 0 {
				t.Errorf("the API server refused %d of %d objects of stack %s:\n%s",
					len(refused), len(objs), stack, strings.Join(refused, "\n"))
			}
		})
	}
}

// TestDryRunRefusesInvalidObjects shows that TestStackObjectsAreValid would catch a broken
// object of each kind whose schema comes from test/kubetest/crds: a CRD that preserved
// unknown fields, or a dry run that skipped validation, would let these through.
func TestDryRunRefusesInvalidObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mapper := restMapper(t)
	recorded := map[string]*unstructured.Unstructured{} // by kind, from the EKS and AKS stacks
	for _, stack := range []string{"eks-dev", "aks-dev"} {
		m, err := mocktest.Run(infra.Program,
			mocktest.WithConfig(stackConfig(t, filepath.Join(testenv.ModuleRoot(), "stacks", "Pulumi."+stack+".yaml"))),
			func(info *pulumi.RunInfo) { info.Stack = stack })
		if err != nil {
			t.Fatalf("%s: %v", stack, err)
		}
		for _, r := range m.All() {
			if o, err := toObject(r); err != nil {
				t.Fatal(err)
			} else if o != nil && recorded[o.GetKind()] == nil {
				// Into "default", which exists: a missing namespace would be refused anyway.
				if o.GetNamespace() != "" {
					o.SetNamespace(metav1.NamespaceDefault)
				}
				recorded[o.GetKind()] = o
			}
		}
	}
	for _, tc := range []struct {
		kind  string
		path  []string
		value any
	}{
		{"NodePool", []string{"spec", "disruption", "consolidationPolicy"}, "Sometimes"},
		{"NodePool", []string{"spec", "template", "spec", "taintz"}, []any{}},
		{"EC2NodeClass", []string{"spec", "metadataOptions", "httpTokens"}, "maybe"},
		{"AKSNodeClass", []string{"spec", "imageFamily"}, "Windows"},
		{"AKSNodeClass", []string{"spec", "osDiskSizeGB"}, int64(4)},
		{"CiliumNetworkPolicy", []string{"spec", "egressDenyy"}, []any{}},
		{"CiliumNetworkPolicy", []string{"spec", "endpointSelector", "matchExpressions"}, "app"},
	} {
		t.Run(tc.kind+"."+strings.Join(tc.path, "."), func(t *testing.T) {
			o := recorded[tc.kind]
			if o == nil {
				t.Fatalf("no %s recorded", tc.kind)
			}
			if err := dryRunCreate(ctx, mapper, o); err != nil {
				t.Fatalf("the unchanged %s was refused: %v", tc.kind, err)
			}
			o = o.DeepCopy()
			if err := unstructured.SetNestedField(o.Object, tc.value, tc.path...); err != nil {
				t.Fatal(err)
			}
			err := dryRunCreate(ctx, mapper, o)
			if err == nil {
				t.Fatalf("%s with %s = %v was accepted", tc.kind, strings.Join(tc.path, "."), tc.value)
			}
			t.Log(err)
		})
	}
}

// toObject converts a recorded resource into the object the Kubernetes provider would send:
// apiVersion and kind from the type token, the inputs as the body, and the logical name when
// the inputs name none (the provider would auto-name it from the logical name). It returns
// nil for what is not a Kubernetes object: components, providers, Helm releases.
func toObject(r mocktest.Resource) (*unstructured.Unstructured, error) {
	// Type tokens of Kubernetes objects are kubernetes:<group>/<version>:<Kind>, with group
	// "core" for the legacy API group.
	parts := strings.Split(r.Type, ":")
	if len(parts) != 3 || parts[0] != "kubernetes" || !strings.Contains(parts[1], "/") || !r.Custom {
		return nil, nil
	}
	if r.Type == helmReleaseType {
		return nil, nil
	}
	group, version, _ := strings.Cut(parts[1], "/")
	apiVersion := group + "/" + version
	if group == "core" {
		apiVersion = version
	}
	body := r.Props()
	body["apiVersion"], body["kind"] = apiVersion, parts[2]
	// Through JSON, so that numbers become the int64 and float64 unstructured objects hold.
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encoding inputs: %w", err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(b); err != nil {
		return nil, fmt.Errorf("decoding inputs: %w", err)
	}
	if obj.GetName() == "" {
		obj.SetName(r.Name)
	}
	return obj, nil
}

// templatePod returns the sandbox pod template of the recorded manager as a Pod object in the
// sandbox namespace (the one the admission policy binding selects).
func templatePod(m *mocktest.Mocks) (*unstructured.Unstructured, error) {
	// The manager component's ConfigMaps: the sandbox template and the authorisation policy.
	var tmplMaps []string
	var text string
	for _, cm := range m.ByType("kubernetes:core/v1:ConfigMap") {
		if t := mocktest.Str(cm.Props(), "data", manager.SandboxTemplateKey); t != "" {
			tmplMaps, text = append(tmplMaps, cm.Name), t
		}
	}
	// The sandbox pods' binding selects their namespace; on eks and aks the gVisor node
	// installer's (on nodes) is there too.
	var bindings []mocktest.Resource
	for _, b := range m.ByType("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding") {
		if mocktest.Dig(b.Props(), "spec", "matchResources", "namespaceSelector") != nil {
			bindings = append(bindings, b)
		}
	}
	if len(tmplMaps) != 1 || len(bindings) != 1 {
		return nil, fmt.Errorf("want one ConfigMap with the sandbox template and one sandbox admission policy binding, got %v and %d", tmplMaps, len(bindings))
	}
	ns := mocktest.Str(bindings[0].Props(), "spec", "matchResources", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")
	if ns == "" {
		return nil, fmt.Errorf("no sandbox namespace in the admission policy binding")
	}
	pod := &unstructured.Unstructured{}
	if err := yaml.UnmarshalStrict([]byte(text), &pod.Object); err != nil {
		return nil, fmt.Errorf("sandbox template: %w", err)
	}
	pod.SetNamespace(ns)
	pod.SetName("sandbox-template")
	return pod, nil
}

// dryRunCreate creates obj with server-side dry run and strict field validation (unknown
// fields are refused, not silently pruned). An object that exists already (a namespace this
// test created, the harness's gvisor RuntimeClass) is validated as a dry-run update instead.
func dryRunCreate(ctx context.Context, mapper meta.RESTMapper, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("the API server does not serve it (add its vendored CRD to test/kubetest/crds): %w", err)
	}
	var client dynamic.ResourceInterface = env.Dynamic.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault) // as the provider does without a namespace
		}
		client = env.Dynamic.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	dry := []string{metav1.DryRunAll}
	_, err = client.Create(ctx, obj, metav1.CreateOptions{DryRun: dry, FieldValidation: "Strict"})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur, err := client.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	obj = obj.DeepCopy()
	obj.SetResourceVersion(cur.GetResourceVersion())
	_, err = client.Update(ctx, obj, metav1.UpdateOptions{DryRun: dry, FieldValidation: "Strict"})
	return err
}

func restMapper(t *testing.T) meta.RESTMapper {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	return restmapper.NewDiscoveryRESTMapper(groups)
}

// deleteNamespaces deletes the namespaces and waits until the namespace controller has
// removed them, so that later tests find the cluster as the harness left it.
func deleteNamespaces(t *testing.T, names map[string]bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for ns := range names {
		if err := env.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	}
	for ns := range names {
		waitGone(t, 45*time.Second, "namespace "+ns, func() error {
			_, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return err
		})
	}
}

// stackConfig loads a stack file as the Pulumi engine hands it to a Go program, with a test
// release written into it (the repository's stack files pin no images).
func stackConfig(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	released := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(released, stacktest.Released(t, b, path), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := mocktest.StackConfig(released)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
