// Command nodeadm-containerd renders the containerd configuration that nodeadm (the AL2023 EKS
// AMI's node agent, github.com/awslabs/amazon-eks-ami/nodeadm) writes for a userData document,
// with nodeadm's own code: its MIME parser and NodeConfig merge (configprovider.
// ParseMaybeMultipart, api.MergeNodeConfigs), its validation, and its containerd daemon's
// Configure, which renders its template, merges spec.containerd.config into it and, for
// containerd 2.x given a version 2 config, runs `containerd config migrate`.
//
// nodeadm writes fixed paths (/etc/containerd/config.toml, base-runtime-spec.json) and reads
// the containerd version from /etc/eks/containerd-version.txt, so the rendering runs in a
// private mount namespace with a tmpfs over /etc: nothing on the host changes.
//
// Usage: nodeadm-containerd -containerd-version 2.1.5 [-containerd /path/to/containerd] <userdata
// prints the config.toml nodeadm would write. The userData is the document EC2 hands the node
// (plain or base64; Karpenter's serialized userData is base64).
//
// The module's path lies under nodeadm's own: Go lets only import paths below
// github.com/awslabs/amazon-eks-ami/nodeadm/ import its internal packages, and all of the code
// this program runs is there.
package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/awslabs/amazon-eks-ami/nodeadm/internal/api"
	"github.com/awslabs/amazon-eks-ami/nodeadm/internal/configprovider"
	"github.com/awslabs/amazon-eks-ami/nodeadm/internal/containerd"
	"github.com/awslabs/amazon-eks-ami/nodeadm/internal/system"
	"go.uber.org/zap"
)

// childEnv marks the re-executed process that runs inside the private mount namespace.
const childEnv = "FUSEBOX_NODEADM_CHILD"

func main() {
	ctrdVersion := flag.String("containerd-version", "", "the node's containerd version (e.g. 2.1.5 or 1.7.27), as /etc/eks/containerd-version.txt states it on the AMI")
	ctrdBin := flag.String("containerd", "", "a containerd binary for `containerd config migrate` (needed for containerd 2.x with a version 2 config)")
	kubeletVersion := flag.String("kubelet-version", "v1.34.0", "the node's kubelet version (nodeadm enables CDI from v1.32)")
	flag.Parse()
	if err := run(*ctrdVersion, *ctrdBin, *kubeletVersion); err != nil {
		fmt.Fprintf(os.Stderr, "nodeadm-containerd: %v\n", err)
		os.Exit(1)
	}
}

var semver = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)

func run(ctrdVersion, ctrdBin, kubeletVersion string) error {
	if !semver.MatchString(ctrdVersion) {
		return fmt.Errorf("-containerd-version %q: want MAJOR.MINOR.PATCH", ctrdVersion)
	}
	if os.Getenv(childEnv) == "1" {
		return render(ctrdVersion, kubeletVersion)
	}
	if ctrdBin != "" {
		abs, err := filepath.Abs(ctrdBin)
		if err != nil {
			return err
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("-containerd %s: not an executable file", ctrdBin)
		}
		ctrdBin = abs
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// PATH: nodeadm runs `containerd config migrate` by name. Without -containerd there is none,
	// and nodeadm fails where it would need one.
	path := "/nonexistent"
	if ctrdBin != "" {
		path = filepath.Dir(ctrdBin)
	}
	cmd.Env = []string{childEnv + "=1", "PATH=" + path}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if os.Geteuid() != 0 {
		// Unprivileged: a user namespace owns the new mount namespace.
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		return fmt.Errorf("starting the renderer in a private mount namespace: %w", err)
	}
	return nil
}

// render runs inside the private mount namespace: /etc is a fresh tmpfs holding only what
// nodeadm reads and writes there.
func render(ctrdVersion, kubeletVersion string) error {
	userData, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fmt.Errorf("reading the userData: %w", err)
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mount namespace private: %w", err)
	}
	if err := syscall.Mount("tmpfs", "/etc", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a tmpfs over /etc: %w", err)
	}
	if err := os.MkdirAll("/etc/eks", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile("/etc/eks/containerd-version.txt", []byte("containerd github.com/containerd/containerd/v2 v"+ctrdVersion+"\n"), 0o644); err != nil {
		return err
	}
	log := zap.Must(zap.NewDevelopment(zap.ErrorOutput(zap.CombineWriteSyncers(os.Stderr))))
	zap.ReplaceGlobals(log)

	// EC2 hands nodeadm the userData as it is; Karpenter's is base64 (nodeadm decodes either).
	if dec, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(userData))); err == nil {
		userData = dec
	}
	cfg, err := configprovider.ParseMaybeMultipart(userData)
	if err != nil {
		return fmt.Errorf("nodeadm parsing the userData: %w", err)
	}
	// What nodeadm init's enrichConfig sets from the node (kubelet --version, its defaults).
	cfg.Status.KubeletVersion = kubeletVersion
	cfg.Status.Defaults = api.DefaultOptions{SandboxImage: "localhost/kubernetes/pause"}
	if err := api.ValidateNodeConfig(cfg); err != nil {
		return fmt.Errorf("nodeadm validating the merged NodeConfig: %w", err)
	}
	d := containerd.NewContainerdDaemon(nil, system.NewResources(system.RealFileSystem{}))
	if err := d.Configure(cfg); err != nil {
		return fmt.Errorf("nodeadm configuring containerd: %w", err)
	}
	out, err := os.ReadFile("/etc/containerd/config.toml")
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}
