package kubealloc

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest/golden"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestBuildPodGolden: the pods BuildPod makes are what testdata/pod-<case>.json holds.
func TestBuildPodGolden(t *testing.T) {
	tpl, err := ParseTemplate([]byte(templateYAML))
	if err != nil {
		t.Fatal(err)
	}
	tpl.ImagePullSecrets = []string{"team-cred", "regcred"}
	bare := Template{Image: "registry.example.com/fusebox/sandbox@sha256:0123", WorkspaceSize: resource.MustParse("2Gi")}
	for name, s := range map[string]PodSpec{
		"default": {ID: "sb-1", Namespace: "ns", TemplateName: "default", Template: DefaultTemplate("img"), RuntimeClassName: "gvisor", Pool: DefaultNodePool()},
		"template": {ID: "sb-2", Namespace: "ns", TemplateName: "ml", Template: tpl, RuntimeClassName: "gvisor", Pool: DefaultNodePool(),
			ImagePullSecrets: []string{"regcred", "mgr-cred"}},
		"bare-on-node": {ID: "sb-3", Namespace: "other", TemplateName: "bare", Template: bare, RuntimeClassName: "runsc", NodeName: "node-1"},
	} {
		t.Run(name, func(t *testing.T) {
			golden.JSON(t, filepath.Join("testdata", "pod-"+name+".json"), BuildPod(s))
		})
	}
}

// TestTemplateFromPodGolden: the Template read from templateYAML, and the whole message of
// each refusal, are what testdata/template*.json hold.
func TestTemplateFromPodGolden(t *testing.T) {
	tpl, err := ParseTemplate([]byte(templateYAML))
	if err != nil {
		t.Fatal(err)
	}
	golden.JSON(t, filepath.Join("testdata", "template.json"), tpl)

	refusals := map[string]string{}
	for _, c := range []struct{ name, from, to string }{
		{"kind", "kind: Pod", "kind: Deployment"},
		{"init containers", "restartPolicy: Never", "restartPolicy: Never\n  initContainers: [{name: i, image: x}]"},
		{"node name", "restartPolicy: Never", "restartPolicy: Never\n  nodeName: n1"},
		{"service account", "restartPolicy: Never", "restartPolicy: Never\n  serviceAccountName: sa"},
		{"fs group", "runAsNonRoot: false", "runAsNonRoot: false\n    fsGroup: 0"},
		{"sysctls", "runAsNonRoot: false", "runAsNonRoot: false\n    sysctls: [{name: net.core.somaxconn, value: \"1\"}]"},
		{"pod group", "runAsNonRoot: false", "runAsNonRoot: false\n    runAsGroup: 65532"},
		{"command", "    args: [", "    command: [/bin/sh]\n    args: ["},
		{"volume mounts", "    args: [", "    volumeMounts: [{name: w, mountPath: /w}]\n    args: ["},
		{"proc mount", "privileged: false", "privileged: false\n      procMount: Unmasked"},
		{"container user", "privileged: false", "privileged: false\n      runAsUser: 65532"},
		{"container seccomp", "privileged: false", "privileged: false\n      seccompProfile: {type: Unconfined}"},
		{"udp port", "{name: init, containerPort: 7070}", "{name: init, containerPort: 7070, protocol: UDP}"},
		{"host ip", "{name: init, containerPort: 7070}", "{name: init, containerPort: 7070, hostIP: 10.0.0.1}"},
		{"bare listen flag", "-init-listen=tcp://0.0.0.0:7070", "-init-listen"},
		{"workspace flag", "-init-listen=tcp://0.0.0.0:7070", "-workspace=/tmp"},
		{"sandbox id label", "team: ml", "team: ml\n    fusebox.dev/sandbox-id: x"},
		{"empty pull secret", "restartPolicy: Never", "restartPolicy: Never\n  imagePullSecrets: [{name: \"\"}]"},
		{"privileged", "privileged: false", "privileged: true"},
		{"runc", "runtimeClassName: gvisor", "runtimeClassName: runc"},
		{"privilege escalation", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true"},
		{"service account token", "automountServiceAccountToken: false", "automountServiceAccountToken: true"},
		{"server user", "runAsNonRoot: false", "runAsNonRoot: false\n    runAsUser: 65532"},
		{"pod non-root", "runAsNonRoot: false", "runAsNonRoot: true"},
		{"added capability", "add: [SETUID, SETGID]", "add: [SETUID, SETGID, NET_ADMIN]"},
		{"capabilities kept", "capabilities: {drop: [ALL], add: [SETUID, SETGID]}", "capabilities: {drop: [NET_RAW]}"},
		{"commands as the server", "-max-file-bytes=4096", "-command-user="},
		{"writable root", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"},
		{"unconfined seccomp", "type: RuntimeDefault", "type: Unconfined"},
		{"host network", "restartPolicy: Never", "restartPolicy: Never\n  hostNetwork: true"},
		{"host path", "restartPolicy: Never", "restartPolicy: Never\n  volumes: [{name: h, hostPath: {path: /}}]"},
		{"restart", "restartPolicy: Never", "restartPolicy: Always"},
		{"other port", "{name: data, containerPort: 7071, protocol: TCP}", "{name: data, containerPort: 8080}"},
		{"extra port", "{name: data, containerPort: 7071, protocol: TCP}", "{name: data, containerPort: 7071}\n    - {name: ssh, containerPort: 22}"},
		{"host port", "{name: init, containerPort: 7070}", "{name: init, containerPort: 7070, hostPort: 7070}"},
		{"listen elsewhere", "-init-listen=tcp://0.0.0.0:7070", "-init-listen=tcp://0.0.0.0:9999"},
		{"legacy state label", "team: ml", "team: ml\n    fusebox.dev/state: bound"},
		{"other app", "app.kubernetes.io/name: fusebox-sandbox", "app.kubernetes.io/name: something-else"},
		{"allocator's annotation", "example.com/owner: ml-platform", "kube.fusebox.dev/claimed-by: me"},
		{"template hash label", "team: ml", "team: ml\n    fusebox.dev/template-hash: abc"},
		{"do-not-disrupt on warm pods", "example.com/owner: ml-platform", "karpenter.sh/do-not-disrupt: \"true\""},
		{"no image", "image: registry.example.com/fusebox/sandbox@sha256:0123", "image: \"\""},
	} {
		y := strings.Replace(templateYAML, c.from, c.to, 1)
		if y == templateYAML {
			t.Fatalf("%s: fixture does not contain %q", c.name, c.from)
		}
		_, err := ParseTemplate([]byte(y))
		if !errors.Is(err, ErrTemplate) {
			t.Errorf("%s: ParseTemplate = %v, want a refusal", c.name, err)
			continue
		}
		refusals[c.name] = err.Error()
	}
	// Two containers, with the pod itself (TemplateFromPod without the YAML).
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "a"}, {Image: "b"}}}}
	if _, err := TemplateFromPod(p); err != nil {
		refusals["containers"] = err.Error()
	}
	golden.JSON(t, filepath.Join("testdata", "template-refusals.json"), refusals)
}
