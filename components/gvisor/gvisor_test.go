package gvisor

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"sigs.k8s.io/yaml"
)

const runtimeClassType = "kubernetes:node.k8s.io/v1:RuntimeClass"

func TestEKSUserData(t *testing.T) {
	base := "https://mirror.example.com/gvisor/release/20250120"
	ud, err := EKSUserData(UserDataOptions{BinaryBaseURL: base + "/"})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := mail.ReadMessage(strings.NewReader(ud))
	if err != nil {
		t.Fatalf("userData is not a MIME message: %v", err)
	}
	if v := msg.Header.Get("MIME-Version"); v != "1.0" {
		t.Errorf("MIME-Version %q", v)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/mixed" {
		t.Fatalf("content type %q, %v", mt, err)
	}
	parts := map[string]string{}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading parts: %v", err)
		}
		b, _ := io.ReadAll(p)
		ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		parts[ct] = string(b)
	}
	if len(parts) != 2 {
		t.Fatalf("want 2 parts (nodeadm's NodeConfig, the install script), got %d: %v", len(parts), parts)
	}

	// The runtime is registered through nodeadm's NodeConfig (TestEKSUserDataNodeadm runs
	// nodeadm's own code on it); here, the part as nodeadm's YAML decoder reads it.
	var nc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Containerd struct {
				Config string `json:"config"`
			} `json:"containerd"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict([]byte(parts[NodeConfigContentType]), &nc); err != nil {
		t.Fatalf("NodeConfig part: %v\n%s", err, parts[NodeConfigContentType])
	}
	if nc.APIVersion != "node.eks.aws/v1alpha1" || nc.Kind != "NodeConfig" {
		t.Errorf("NodeConfig part is %s %s", nc.APIVersion, nc.Kind)
	}
	if nc.Spec.Containerd.Config != ContainerdRunscConfig() {
		t.Errorf("spec.containerd.config:\n%s\nwant:\n%s", nc.Spec.Containerd.Config, ContainerdRunscConfig())
	}

	sh := parts["text/x-shellscript"]
	for _, want := range []string{
		"#!/bin/bash",
		"set -euo pipefail",
		"base='" + base + "'", // trailing slash trimmed
		`"$base/$arch/$bin"`,
		"runsc containerd-shim-runsc-v1",
		"sha512sum -c",
		`install -m 0755 "$tmp/$bin" "/usr/local/bin/$bin"`,
		// runsc with the kubelet's systemd cgroup driver (gVisor issue 10371).
		"cat >'" + RunscConfigPath + "' <<RUNSC",
		"[runsc_config]",
		`systemd-cgroup = "$cgroup"`,
	} {
		if !strings.Contains(sh, want) {
			t.Errorf("script part lacks %q:\n%s", want, sh)
		}
	}
	// nodeadm's containerd config imports nothing: a drop-in would never be read.
	if strings.Contains(sh, "config.d") || strings.Contains(sh, "runtime_type") {
		t.Errorf("script still registers the runtime in a drop-in:\n%s", sh)
	}
}

func TestContainerdRunscConfig(t *testing.T) {
	var c map[string]any
	if _, err := toml.Decode(ContainerdRunscConfig(), &c); err != nil {
		t.Fatalf("%v\n%s", err, ContainerdRunscConfig())
	}
	// Version 2: containerd 1.x reads it, and nodeadm migrates it on containerd 2.x; version 3
	// fails nodeadm on containerd 1.x (nodeadm/internal/containerd/config.go,
	// getConfigTemplateVersion).
	if c["version"] != int64(2) {
		t.Errorf("version %v, want 2", c["version"])
	}
	r := c["plugins"].(map[string]any)["io.containerd.grpc.v1.cri"].(map[string]any)["containerd"].(map[string]any)["runtimes"].(map[string]any)["runsc"].(map[string]any)
	opts := r["options"].(map[string]any)
	if r["runtime_type"] != "io.containerd.runsc.v1" || opts["TypeUrl"] != "io.containerd.runsc.v1.options" || opts["ConfigPath"] != RunscConfigPath {
		t.Errorf("runsc runtime %v", r)
	}
}

func TestEKSUserDataRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "relative/path", "ftp://mirror/x", "https://", "https://m.example.com/x'; rm -rf / #", "https://m.example.com/$(id)", "https://m.example.com/a b"} {
		t.Run(u, func(t *testing.T) {
			if _, err := EKSUserData(UserDataOptions{BinaryBaseURL: u}); !errors.Is(err, ErrBadBinaryURL) {
				t.Fatalf("want ErrBadBinaryURL, got %v", err)
			}
		})
	}
}

func TestGVisorPerCloud(t *testing.T) {
	for _, tc := range []struct {
		cloud      components.Cloud
		schedule   bool
		wantRC     bool
		wantSource string
	}{
		{components.EKS, true, true, SourceCreated},
		{components.AKS, true, true, SourceCreated},
		{components.GKE, false, false, SourceGKESandbox},
		{components.Local, false, true, SourceCreated},
	} {
		t.Run(string(tc.cloud), func(t *testing.T) {
			var source, rcName string
			m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
				args := &GVisorArgs{Cloud: tc.cloud, ScheduleOnSandboxNodes: tc.schedule}
				switch tc.cloud {
				case components.AKS:
					args.NodeInstaller = testInstaller()
				case components.EKS:
					args.NodeInstaller = &NodeInstallerArgs{Image: testInstaller().Image, VerifyOnly: true}
				}
				g, err := NewGVisor(ctx, "fb", args)
				if err != nil {
					return err
				}
				if source, err = mocktest.Await[string](ctx, g.RuntimeClassSource); err != nil {
					return err
				}
				rcName, err = mocktest.Await[string](ctx, g.RuntimeClassName)
				return err
			})
			m.One(t, Type)
			m.AssertParented(t, Type)
			if source != tc.wantSource || rcName != "gvisor" {
				t.Errorf("outputs: source %q name %q", source, rcName)
			}
			rcs := m.ByType(runtimeClassType)
			if n := len(m.ByType(daemonSetType)); n != map[bool]int{true: 1}[tc.cloud == components.AKS || tc.cloud == components.EKS] {
				t.Errorf("%s: %d node-installer DaemonSets", tc.cloud, n)
			}
			if !tc.wantRC {
				if len(rcs) != 0 {
					t.Fatalf("GKE: want no RuntimeClass, got %d", len(rcs))
				}
				if len(m.All()) != 1 {
					t.Fatalf("GKE: want only the component, got %v", m.All())
				}
				return
			}
			rc := m.One(t, runtimeClassType)
			p := rc.Props()
			if rc.Name != "fb-runtimeclass" || mocktest.Str(p, "metadata", "name") != "gvisor" || mocktest.Str(p, "handler") != "runsc" {
				t.Errorf("RuntimeClass %s: %v", rc.Name, p)
			}
			// The measured cost of the sentry and gofers (docs/performance.md), which the
			// scheduler adds to every sandbox pod.
			if mocktest.Str(p, "overhead", "podFixed", "memory") != "88Mi" || mocktest.Str(p, "overhead", "podFixed", "cpu") != "1m" {
				t.Errorf("RuntimeClass overhead %v: want podFixed memory 88Mi, cpu 1m", mocktest.Dig(p, "overhead"))
			}
			sel := mocktest.Str(p, "scheduling", "nodeSelector", components.SandboxPoolLabelKey)
			tol := mocktest.Dig(p, "scheduling", "tolerations", 0)
			if tc.schedule {
				if sel != "sandbox" || mocktest.Str(tol, "key") != components.SandboxTaintKey ||
					mocktest.Str(tol, "effect") != "NoSchedule" || mocktest.Str(tol, "value") != "true" {
					t.Errorf("scheduling: %v", mocktest.Dig(p, "scheduling"))
				}
				// Sandbox pods must not tolerate the AKS startup taint: it keeps them off a
				// node until the node installer has made runsc work there.
				if extra := mocktest.Dig(p, "scheduling", "tolerations", 1); extra != nil {
					t.Errorf("RuntimeClass tolerates more than the sandbox taint: %v", extra)
				}
			} else if mocktest.Dig(p, "scheduling") != nil {
				t.Errorf("unexpected scheduling: %v", mocktest.Dig(p, "scheduling"))
			}
		})
	}
}

func TestGVisorRefusesUnknownCloud(t *testing.T) {
	_, err := mocktest.Run(func(ctx *pulumi.Context) error {
		_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: "openstack"})
		return err
	})
	if !errors.Is(err, components.ErrUnknownCloud) {
		t.Fatalf("want ErrUnknownCloud, got %v", err)
	}
}
