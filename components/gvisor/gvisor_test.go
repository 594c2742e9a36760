package gvisor

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
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
	if len(parts) != 1 {
		t.Fatalf("want 1 part (the script: the runtime's table depends on containerd's version), got %d: %v", len(parts), parts)
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
		// The config version of the node's containerd: 3 for 2.x, 2 for 1.x.
		"containerd --version",
		`1) version=2; table='plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc'`,
		`2|3) version=3; table='plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc'`,
		"/etc/containerd/config.d/fusebox-runsc.toml",
		`runtime_type = "io.containerd.runsc.v1"`,
		`ConfigPath = "/etc/containerd/runsc.toml"`,
		// runsc with the kubelet's systemd cgroup driver (gVisor issue 10371).
		"[runsc_config]",
		`systemd-cgroup = "$cgroup"`,
	} {
		if !strings.Contains(sh, want) {
			t.Errorf("script part lacks %q:\n%s", want, sh)
		}
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
