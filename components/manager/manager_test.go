package manager

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	corev1p "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	digest          = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
	mgrImage        = "registry.example.com/fusebox/manager@sha256:" + digest
	sbxImage        = "registry.example.com/fusebox/sandbox@sha256:" + digest
	deployType      = "kubernetes:apps/v1:Deployment"
	roleType        = "kubernetes:rbac.authorization.k8s.io/v1:Role"
	bindingType     = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
	clusterRoleType = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
)

func args() *ManagerArgs {
	return &ManagerArgs{
		Namespace: pulumi.String("mgr"), SandboxNamespace: pulumi.String("sbx"),
		Image: mgrImage, Sandbox: SandboxTemplate{Image: sbxImage}, AgentNamespaces: []string{"agents"},
	}
}

func run(t *testing.T, a *ManagerArgs) (*mocktest.Mocks, string) {
	t.Helper()
	var endpoint string
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		mg, err := NewManager(ctx, "fb", a)
		if err != nil {
			return err
		}
		endpoint, err = mocktest.Await[string](ctx, mg.Endpoint)
		return err
	})
	m.One(t, Type)
	m.AssertParented(t, Type)
	return m, endpoint
}

func strs(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

func TestRBACIsLeastPrivilege(t *testing.T) {
	m, _ := run(t, args())
	type rule struct{ ns, role, group, resource, names string }
	got := map[rule][]string{}
	collect := func(kind string, r mocktest.Resource) {
		p := r.Props()
		ns := mocktest.Str(p, "metadata", "namespace")
		if kind == roleType && ns == "" {
			t.Errorf("role %s is not namespaced", r.Name)
		}
		rules, _ := mocktest.Dig(p, "rules").([]any)
		for _, ru := range rules {
			groups, res, verbs := strs(mocktest.Dig(ru, "apiGroups")), strs(mocktest.Dig(ru, "resources")), strs(mocktest.Dig(ru, "verbs"))
			if len(groups) != 1 || len(res) != 1 {
				t.Errorf("rule %v: want one group and one resource", ru)
				continue
			}
			for _, s := range append(append(groups, res...), verbs...) {
				if s == "*" {
					t.Errorf("wildcard in %v", ru)
				}
			}
			got[rule{ns, mocktest.Str(p, "metadata", "name"), groups[0], res[0], strings.Join(strs(mocktest.Dig(ru, "resourceNames")), ",")}] = verbs
		}
	}
	for _, r := range m.ByType(roleType) {
		collect(roleType, r)
	}
	// The one cluster-wide permission: checking agents' tokens.
	crs := m.ByType(clusterRoleType)
	if len(crs) != 1 || mocktest.Str(crs[0].Props(), "metadata", "name") != TokenReviewRoleName {
		t.Fatalf("cluster roles %v, want only %s", crs, TokenReviewRoleName)
	}
	collect(clusterRoleType, crs[0])
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	want := map[rule][]string{
		{"sbx", sandboxRoleName, "", "pods", ""}:                           all,
		{"sbx", sandboxRoleName, "cilium.io", "ciliumnetworkpolicies", ""}: all,
		{"mgr", electionRoleName, "coordination.k8s.io", "leases", ""}:     {"get", "create", "update"},
		{"mgr", tlsRoleName, "", "secrets", TLSSecretName}:                 {"get", "list", "watch"},
		{"mgr", tlsRoleName, "", "secrets", ""}:                            {"create"},
		{"mgr", tlsRoleName, "", "configmaps", CAConfigMapName}:            {"get", "update"},
		{"mgr", tlsRoleName, "", "configmaps", ""}:                         {"create"},
		// Its own Deployment: watched for its deletion, its RemovalFinalizer removed.
		{"mgr", removalRoleName, "apps", "deployments", ObjectName}:            {"get", "list", "watch", "update"},
		{"", TokenReviewRoleName, "authentication.k8s.io", "tokenreviews", ""}: {"create"},
		// Any authenticated user may get the CA ConfigMap, nothing else.
		{"mgr", caReaderRoleName, "", "configmaps", CAConfigMapName}: {"get"},
	}
	if len(got) != len(want) {
		t.Errorf("rules %v, want %v", got, want)
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("%+v: verbs %v, want %v", k, got[k], v)
		}
	}
	for _, b := range m.ByType(bindingType) {
		p := b.Props()
		if mocktest.Str(p, "metadata", "name") == caReaderRoleName {
			if mocktest.Str(p, "subjects", 0, "kind") != "Group" || mocktest.Str(p, "subjects", 0, "name") != "system:authenticated" {
				t.Errorf("CA reader binding %v", p)
			}
			continue
		}
		if mocktest.Str(p, "roleRef", "kind") != "Role" || mocktest.Str(p, "subjects", 0, "name") != ObjectName ||
			mocktest.Str(p, "subjects", 0, "namespace") != "mgr" || mocktest.Str(p, "metadata", "namespace") == "" {
			t.Errorf("binding %s: %v", b.Name, p)
		}
	}
	crb := m.One(t, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding").Props()
	if mocktest.Str(crb, "roleRef", "name") != TokenReviewRoleName || mocktest.Str(crb, "subjects", 0, "name") != ObjectName {
		t.Errorf("token review binding %v", crb)
	}
}

func TestAPISecurityArgs(t *testing.T) {
	a := args()
	a.Access = []AccessRule{{Namespaces: []string{"agents"}, Egress: []string{"pypi.org:443"}}}
	a.Operators = []string{"mgr/ops"}
	m, _ := run(t, a)
	c := mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec", "containers", 0)
	argv := strs(mocktest.Dig(c, "args"))
	for _, want := range []string{"--listen=tcp://0.0.0.0:9090", "--tls-secret=" + TLSSecretName, "--tls-secret-create=true",
		"--tls-dns-names=fusebox-manager,fusebox-manager.mgr,fusebox-manager.mgr.svc,fusebox-manager.mgr.svc.cluster.local",
		"--ca-configmap=" + CAConfigMapName, "--token-audience=" + DefaultTokenAudience, "--auth-policy=/etc/fusebox/policy/policy.yaml"} {
		if !slices.Contains(argv, want) {
			t.Errorf("args %v lack %s", argv, want)
		}
	}
	var policy string
	for _, cm := range m.ByType("kubernetes:core/v1:ConfigMap") {
		if mocktest.Str(cm.Props(), "metadata", "name") == PolicyCMName {
			policy = mocktest.Str(cm.Props(), "data", PolicyKey)
		}
	}
	p, err := auth.ParsePolicy([]byte(policy))
	if err != nil {
		t.Fatalf("rendered policy %q: %v", policy, err)
	}
	if ops := p.Operators(); !slices.Equal(ops, []string{"mgr/ops"}) {
		t.Errorf("operators %v", ops)
	}
	// A user-provided (cert-manager) Secret is read, never created.
	a = args()
	a.TLSSecret = "my-cert"
	m, _ = run(t, a)
	argv = strs(mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec", "containers", 0, "args"))
	if !slices.Contains(argv, "--tls-secret=my-cert") || !slices.Contains(argv, "--tls-secret-create=false") {
		t.Errorf("args %v", argv)
	}
}

func TestRefusesABadPolicy(t *testing.T) {
	a := args()
	a.Access = []AccessRule{{Namespaces: []string{"agents"}, Egress: []string{"pypi.org"}}}
	_, err := mocktest.Run(func(ctx *pulumi.Context) error { _, err := NewManager(ctx, "fb", a); return err })
	if err == nil || !strings.Contains(err.Error(), `rules[0].egress: malformed egress allowlist entry "pypi.org"`) {
		t.Fatalf("NewManager with a bad policy = %v", err)
	}
}

func TestDeployment(t *testing.T) {
	m, endpoint := run(t, args())
	if endpoint != "fusebox-manager.mgr.svc:9090" {
		t.Errorf("endpoint %q", endpoint)
	}
	d := m.One(t, deployType)
	p := d.Props()
	if d.Name != "fb-deployment" || mocktest.Str(p, "metadata", "namespace") != "mgr" {
		t.Errorf("deployment %s %v", d.Name, mocktest.Dig(p, "metadata"))
	}
	if r, _ := mocktest.Dig(p, "spec", "replicas").(float64); r < 2 {
		t.Errorf("replicas %v", mocktest.Dig(p, "spec", "replicas"))
	}
	pod := mocktest.Dig(p, "spec", "template", "spec")
	if mocktest.Dig(pod, "securityContext", "runAsNonRoot") != true || mocktest.Str(pod, "securityContext", "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("pod securityContext %v", mocktest.Dig(pod, "securityContext"))
	}
	if mocktest.Dig(pod, "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0, "podAffinityTerm", "topologyKey") != "kubernetes.io/hostname" {
		t.Errorf("anti-affinity %v", mocktest.Dig(pod, "affinity"))
	}
	c := mocktest.Dig(pod, "containers", 0)
	if mocktest.Str(c, "image") != mgrImage {
		t.Errorf("image %v", mocktest.Dig(c, "image"))
	}
	sc := mocktest.Dig(c, "securityContext")
	if mocktest.Dig(sc, "runAsNonRoot") != true || mocktest.Dig(sc, "readOnlyRootFilesystem") != true ||
		mocktest.Dig(sc, "allowPrivilegeEscalation") != false || !slices.Equal(strs(mocktest.Dig(sc, "capabilities", "drop")), []string{"ALL"}) ||
		mocktest.Str(sc, "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("container securityContext %v", sc)
	}
	// Liveness and startup: the process serves; readiness: the Manager API, once the warm
	// pool has held a ready sandbox (manager/daemon).
	for probe, service := range map[string]string{"livenessProbe": "", "readinessProbe": managerv1.Manager_ServiceDesc.ServiceName, "startupProbe": ""} {
		if mocktest.Dig(c, probe, "grpc", "port") != 9090.0 || mocktest.Str(c, probe, "grpc", "service") != service {
			t.Errorf("%s %v, want the gRPC health of service %q", probe, mocktest.Dig(c, probe), service)
		}
	}
	if !slices.Contains(strs(mocktest.Dig(c, "args")), "--sandbox-namespace=sbx") {
		t.Errorf("args %v", mocktest.Dig(c, "args"))
	}

	svcs := services(t, m)
	svc := svcs[ObjectName]
	if mocktest.Str(svc, "spec", "ports", 0, "name") != "grpc" || mocktest.Str(svc, "spec", "selector", "app.kubernetes.io/name") != components.ManagerAppLabel {
		t.Errorf("service %v", svc)
	}
	pdb := m.One(t, "kubernetes:policy/v1:PodDisruptionBudget").Props()
	if mocktest.Dig(pdb, "spec", "minAvailable") != 1.0 {
		t.Errorf("pdb %v", pdb)
	}
	m.One(t, "kubernetes:core/v1:ServiceAccount")
}

func TestRequiredAntiAffinity(t *testing.T) {
	a := args()
	a.RequiredAntiAffinity, a.Replicas = true, 3
	m, _ := run(t, a)
	p := m.One(t, deployType).Props()
	if mocktest.Dig(p, "spec", "replicas") != 3.0 ||
		mocktest.Str(p, "spec", "template", "spec", "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution", 0, "topologyKey") != "kubernetes.io/hostname" {
		t.Errorf("spec %v", mocktest.Dig(p, "spec"))
	}
}

func TestSandboxTemplateConfigMap(t *testing.T) {
	m, _ := run(t, args())
	var cm map[string]any
	for _, r := range m.ByType("kubernetes:core/v1:ConfigMap") {
		if mocktest.Str(r.Props(), "metadata", "name") == TemplateCMName {
			cm = r.Props()
		}
	}
	if cm == nil {
		t.Fatalf("no ConfigMap %s", TemplateCMName)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(mocktest.Str(cm, "data", SandboxTemplateKey)), &pod); err != nil {
		t.Fatalf("template: %v", err)
	}
	s := pod.Spec
	if s.RuntimeClassName == nil || *s.RuntimeClassName != "gvisor" || s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Errorf("template spec %+v", s)
	}
	if s.HostNetwork || s.HostPID || s.HostIPC || len(s.Volumes) != 0 {
		t.Errorf("template has host access: %+v", s)
	}
	c := s.Containers[0]
	if c.Image != sbxImage || c.Ports[0].ContainerPort != components.InitPort || c.Ports[1].ContainerPort != components.DataPort {
		t.Errorf("container %+v", c)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || *c.SecurityContext.Privileged ||
		c.SecurityContext.Capabilities == nil || !slices.Equal(c.SecurityContext.Capabilities.Add, []corev1.Capability{"SETUID", "SETGID"}) {
		t.Errorf("container securityContext %+v", c.SecurityContext)
	}
}

func TestRefusesBadArgs(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*ManagerArgs)
		want error
	}{
		"manager tag":    {func(a *ManagerArgs) { a.Image = "registry.example.com/fusebox/manager:v1" }, components.ErrImageNotPinned},
		"sandbox tag":    {func(a *ManagerArgs) { a.Sandbox.Image = "registry.example.com/fusebox/sandbox:latest" }, components.ErrImageNotPinned},
		"tag and digest": {func(a *ManagerArgs) { a.Image = "registry.example.com/fusebox/manager:v1@sha256:" + digest }, components.ErrImageNotPinned},
		"one replica":    {func(a *ManagerArgs) { a.Replicas = 1 }, ErrTooFewReplicas},
		"no sandbox ns":  {func(a *ManagerArgs) { a.SandboxNamespace = nil }, ErrNoNamespace},
		"external names with own certificate": {func(a *ManagerArgs) {
			a.TLSSecret, a.ExternalNames = "mine", []string{"manager.example.com"}
		}, ErrExternalNamesWithTLSSecret},
	} {
		t.Run(name, func(t *testing.T) {
			a := args()
			tc.mut(a)
			m, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewManager(ctx, "fb", a)
				return err
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("want %v, got %v", tc.want, err)
			}
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered before refusing", n)
			}
		})
	}
}

func TestNamespaces(t *testing.T) {
	var mgr, sbx string
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		n, err := NewNamespaces(ctx, "fb", &NamespacesArgs{Manager: "mgr", Sandbox: "sbx"})
		if err != nil {
			return err
		}
		if mgr, err = mocktest.Await[string](ctx, n.Manager); err != nil {
			return err
		}
		sbx, err = mocktest.Await[string](ctx, n.Sandbox)
		return err
	})
	m.AssertParented(t, NamespacesType)
	if mgr != "mgr" || sbx != "sbx" {
		t.Errorf("outputs %q %q", mgr, sbx)
	}
	pss := map[string]string{}
	for _, r := range m.ByType("kubernetes:core/v1:Namespace") {
		p := r.Props()
		pss[mocktest.Str(p, "metadata", "name")] = mocktest.Str(p, "metadata", "labels", "pod-security.kubernetes.io/enforce")
	}
	if pss["mgr"] != "restricted" || pss["sbx"] != "baseline" || len(pss) != 2 {
		t.Errorf("namespaces %v", pss)
	}
	if _, err := mocktest.Run(func(ctx *pulumi.Context) error {
		_, err := NewNamespaces(ctx, "fb", &NamespacesArgs{Manager: "x", Sandbox: "x"})
		return err
	}); !errors.Is(err, ErrSameNamespace) {
		t.Errorf("want ErrSameNamespace, got %v", err)
	}
}

// TestStateDirIsWritable: the root filesystem is read-only, so the manager's --state-dir (its
// lock file) is a writable emptyDir of its own.
func TestStateDirIsWritable(t *testing.T) {
	m, _ := run(t, args())
	pod := mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec")
	c := mocktest.Dig(pod, "containers", 0)
	var dir string
	for _, a := range strs(mocktest.Dig(c, "args")) {
		if v, ok := strings.CutPrefix(a, "--state-dir="); ok {
			dir = v
		}
	}
	if dir == "" {
		t.Fatalf("no --state-dir in %v", mocktest.Dig(c, "args"))
	}
	var volume string
	for _, vm := range mocktest.Dig(c, "volumeMounts").([]any) {
		if mocktest.Str(vm, "mountPath") == dir && mocktest.Dig(vm, "readOnly") != true {
			volume = mocktest.Str(vm, "name")
		}
	}
	found := false
	for _, v := range mocktest.Dig(pod, "volumes").([]any) {
		if mocktest.Str(v, "name") == volume && mocktest.Dig(v, "emptyDir") != nil {
			found = true
		}
	}
	if volume == "" || !found {
		t.Errorf("--state-dir=%s is not a writable emptyDir mount: %v / %v", dir, mocktest.Dig(c, "volumeMounts"), mocktest.Dig(pod, "volumes"))
	}
}

// TestPolicyFlavourReachesTheManager: the manager is told the flavour and the agents'
// namespaces, and may write exactly the flavour's policy kinds.
func TestPolicyFlavourReachesTheManager(t *testing.T) {
	for _, tc := range []struct {
		flavour string
		kinds   []string
	}{
		{"cilium", []string{"cilium.io/ciliumnetworkpolicies"}},
		{"gke", []string{"networking.k8s.io/networkpolicies", "networking.gke.io/fqdnnetworkpolicies"}},
		{"kubernetes", []string{"networking.k8s.io/networkpolicies"}},
	} {
		t.Run(tc.flavour, func(t *testing.T) {
			a := args()
			a.NetworkPolicy = tc.flavour
			a.AgentNamespaces = []string{"agents", "ci"}
			a.ImagePullSecrets = []string{"regcred"}
			m, _ := run(t, a)
			pod := mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec")
			argv := strs(mocktest.Dig(pod, "containers", 0, "args"))
			for _, want := range []string{"--network-policy=" + tc.flavour, "--agent-namespaces=agents,ci", "--manager-namespace=$(POD_NAMESPACE)", "--image-pull-secrets=regcred"} {
				if !slices.Contains(argv, want) {
					t.Errorf("args %v lack %s", argv, want)
				}
			}
			if mocktest.Str(pod, "imagePullSecrets", 0, "name") != "regcred" {
				t.Errorf("manager pod imagePullSecrets %v", mocktest.Dig(pod, "imagePullSecrets"))
			}
			var kinds []string
			for _, r := range m.ByType(roleType) {
				rules, _ := mocktest.Dig(r.Props(), "rules").([]any)
				for _, ru := range rules {
					g, res := strs(mocktest.Dig(ru, "apiGroups")), strs(mocktest.Dig(ru, "resources"))
					if g[0] != "" && g[0] != "coordination.k8s.io" && g[0] != "apps" {
						kinds = append(kinds, g[0]+"/"+res[0])
					}
				}
			}
			if !slices.Equal(kinds, tc.kinds) {
				t.Errorf("policy RBAC %v, want %v", kinds, tc.kinds)
			}
		})
	}
	a := args()
	a.NetworkPolicy = "calico"
	if _, err := mocktest.Run(func(ctx *pulumi.Context) error { _, err := NewManager(ctx, "fb", a); return err }); err == nil {
		t.Error("unknown flavour accepted")
	}
}

// TestClusterDNSReachesTheManager: the cluster's DNS setup is the manager's --cluster-dns
// (none for the default, kube-dns), and a setup the flavour cannot express is refused.
func TestClusterDNSReachesTheManager(t *testing.T) {
	a := args()
	a.NetworkPolicy, a.ClusterDNS = "gke", "gke-clouddns"
	m, _ := run(t, a)
	argv := strs(mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec", "containers", 0, "args"))
	if !slices.Contains(argv, "--cluster-dns=gke-clouddns") {
		t.Errorf("args %v lack --cluster-dns=gke-clouddns", argv)
	}
	m, _ = run(t, args())
	for _, arg := range strs(mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec", "containers", 0, "args")) {
		if strings.HasPrefix(arg, "--cluster-dns") {
			t.Errorf("default setup passes %s", arg)
		}
	}
	a = args()
	a.NetworkPolicy, a.ClusterDNS = "cilium", "aks-localdns"
	if _, err := mocktest.Run(func(ctx *pulumi.Context) error { _, err := NewManager(ctx, "fb", a); return err }); err == nil {
		t.Error("AKS LocalDNS under Cilium accepted")
	}
}

// TestDeploymentIsRemovedAfterItsSandboxes: the Deployment carries the finalizer the manager
// removes once every sandbox pod is gone (kubealloc's), is deleted in the background so that
// its managers keep running until then, and its managers watch it (--deployment); it waits for
// (so is destroyed before) what After names and the manager's RBAC. Without a cluster that
// runs the manager (SkipAwait), the finalizer is left off.
func TestDeploymentIsRemovedAfterItsSandboxes(t *testing.T) {
	if RemovalFinalizer != kubealloc.RemovalFinalizer {
		t.Fatalf("finalizer %q, the manager removes %q", RemovalFinalizer, kubealloc.RemovalFinalizer)
	}
	for _, skip := range []bool{false, true} {
		a := args()
		a.SkipAwait = skip
		var policy pulumi.Resource
		m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
			var err error
			policy, err = corev1p.NewConfigMap(ctx, "sandbox-policy", &corev1p.ConfigMapArgs{})
			if err != nil {
				return err
			}
			a.After = []pulumi.Resource{policy}
			_, err = NewManager(ctx, "fb", a)
			return err
		})
		d := m.One(t, deployType)
		p := d.Props()
		fin := strs(mocktest.Dig(p, "metadata", "finalizers"))
		if want := []string{RemovalFinalizer}; !skip && !slices.Equal(fin, want) || skip && len(fin) != 0 {
			t.Errorf("skipAwait %v: finalizers %v", skip, fin)
		}
		if v := mocktest.Str(p, "metadata", "annotations", "pulumi.com/deletionPropagationPolicy"); v != "background" {
			t.Errorf("deletion propagation %q, want background", v)
		}
		if !slices.Contains(strs(mocktest.Dig(p, "spec", "template", "spec", "containers", 0, "args")), "--deployment="+ObjectName) {
			t.Errorf("the manager does not watch its Deployment: %v", mocktest.Dig(p, "spec", "template", "spec", "containers", 0, "args"))
		}
		deps := map[string]bool{}
		for _, dep := range d.Deps {
			deps[dep[strings.LastIndex(dep, "::")+2:]] = true
		}
		for _, want := range []string{"sandbox-policy", "fb-removal-role-binding", "fb-sandbox-role-binding", "fb-tokenreview-binding"} {
			if !deps[want] {
				t.Errorf("the Deployment does not wait for %s: %v", want, d.Deps)
			}
		}
	}
}

// services are the component's Services by name.
func services(t *testing.T, m *mocktest.Mocks) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, r := range m.ByType("kubernetes:core/v1:Service") {
		out[mocktest.Str(r.Props(), "metadata", "name")] = r.Props()
	}
	return out
}

// TestMetricsAreNeverPublic: the API Service, a LoadBalancer or not, carries the gRPC port
// only; the plaintext, unauthenticated metrics port has a ClusterIP Service of its own.
func TestMetricsAreNeverPublic(t *testing.T) {
	for _, typ := range []string{"ClusterIP", "LoadBalancer"} {
		a := args()
		a.ServiceType, a.MetricsPort = typ, 9100
		m, _ := run(t, a)
		svcs := services(t, m)
		if len(svcs) != 2 {
			t.Fatalf("%s: services %v, want %s and %s", typ, svcs, ObjectName, MetricsServiceName)
		}
		api, metrics := svcs[ObjectName], svcs[MetricsServiceName]
		ports, _ := mocktest.Dig(api, "spec", "ports").([]any)
		if mocktest.Str(api, "spec", "type") != typ || len(ports) != 1 || mocktest.Str(ports[0], "name") != "grpc" {
			t.Errorf("%s: API service %v: want the gRPC port only", typ, mocktest.Dig(api, "spec"))
		}
		ports, _ = mocktest.Dig(metrics, "spec", "ports").([]any)
		if mocktest.Str(metrics, "spec", "type") != "ClusterIP" || len(ports) != 1 || mocktest.Dig(ports[0], "port") != 9100.0 ||
			mocktest.Str(ports[0], "targetPort") != "metrics" || mocktest.Str(metrics, "spec", "selector", "app.kubernetes.io/name") != components.ManagerAppLabel {
			t.Errorf("%s: metrics service %v: want ClusterIP with the metrics port only", typ, mocktest.Dig(metrics, "spec"))
		}
	}
}

// TestTimeouts: Pulumi waits for the Deployment (a first `up`: a node's launch, gVisor's
// install, the image pulls and a warm pool; a rollout; a removal of every sandbox) and a
// LoadBalancer Service for the customTimeouts docs/deploy.md states, not the provider's 10
// minutes.
func TestTimeouts(t *testing.T) {
	for _, typ := range []string{"ClusterIP", "LoadBalancer"} {
		a := args()
		a.ServiceType = typ
		m, _ := run(t, a)
		if got := m.One(t, deployType).Timeouts; got == nil || *got != (mocktest.Timeouts{Create: "20m", Update: "30m", Delete: "15m"}) {
			t.Errorf("Deployment customTimeouts %+v", got)
		}
		for _, s := range m.ByType("kubernetes:core/v1:Service") {
			lb := mocktest.Str(s.Props(), "spec", "type") == "LoadBalancer"
			if want := (mocktest.Timeouts{Create: "15m", Update: "15m"}); lb && (s.Timeouts == nil || *s.Timeouts != want) || !lb && s.Timeouts != nil {
				t.Errorf("%s Service %s customTimeouts %+v", mocktest.Str(s.Props(), "spec", "type"), s.Name, s.Timeouts)
			}
		}
	}
}
