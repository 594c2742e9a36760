package infra

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/fusebox-dev/fusebox/components"
)

// A release writes the digests of pushed images into stack files (`fusebox release`):
//
//	fusebox:registry: HOST[:PORT]/PATH           the registry this stack pulls from
//	fusebox:images:
//	  manager: HOST[:PORT]/PATH/manager@sha256:...
//	  sandbox: HOST[:PORT]/PATH/sandbox@sha256:...
//	fusebox:gvisor:
//	  installerImage: HOST[:PORT]/PATH/gvisor-installer@sha256:...   (eks and aks)
//
// The file is edited as a YAML node tree (comments and key order stay); missing keys are
// added. Promotion later carries the digests and keeps each stack's own registry.

// RegistryKey is the per-stack registry key: where the stack's images are pulled from.
const RegistryKey = Namespace + ":registry"

// ErrRelease is wrapped by every error of WriteRelease and CheckReleaseStacks.
var ErrRelease = errors.New("release refused")

// ReleaseImages are the digest references of one release, by image name (manager, sandbox,
// gvisor-installer), each REGISTRY/<name>@sha256:<64 hex>.
type ReleaseImages map[string]string

// Image names as `fusebox image build` makes them, and the stack keys they are written to.
const (
	ReleaseManager         = "manager"
	ReleaseSandbox         = "sandbox"
	ReleaseGVisorInstaller = "gvisor-installer"
)

var stackName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// StackFile is the path of stack's file in stacksDir.
func StackFile(stacksDir, stack string) string {
	return filepath.Join(stacksDir, "Pulumi."+stack+".yaml")
}

// CheckReleaseStacks reads every stack before anything is built or pushed and returns each
// one's cloud. An unknown stack is refused, naming the stacks that exist.
func CheckReleaseStacks(stacksDir string, stacks []string) (map[string]components.Cloud, error) {
	if len(stacks) == 0 {
		return nil, fmt.Errorf("%w: no stack: pass --stack S (stacks/Pulumi.S.yaml)", ErrRelease)
	}
	clouds := map[string]components.Cloud{}
	for _, s := range stacks {
		if !stackName.MatchString(s) {
			return nil, fmt.Errorf("%w: stack name %q: want letters, digits, '.', '_' or '-'", ErrRelease, s)
		}
		b, err := os.ReadFile(StackFile(stacksDir, s))
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: unknown stack %q: no %s (stacks: %s)", ErrRelease, s, displayPath(StackFile(stacksDir, s)), strings.Join(listStacks(stacksDir), ", "))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading stack %s: %w", ErrRelease, s, err)
		}
		f, err := parseStack(b, displayPath(StackFile(stacksDir, s)))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrRelease, err)
		}
		clouds[s] = f.cloud
	}
	return clouds, nil
}

func listStacks(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "Pulumi.*.yaml"))
	var s []string
	for _, p := range m {
		s = append(s, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "Pulumi."), ".yaml"))
	}
	return s
}

// NeededImages are the images a stack of cloud runs: manager and sandbox, and on AKS the
// gVisor node installer.
func NeededImages(cloud components.Cloud) []string {
	if cloud == components.AKS || cloud == components.EKS {
		// The node installer: installing on AKS, verify-only on EKS (it removes the startup
		// taint once the userData's runsc is registered).
		return []string{ReleaseManager, ReleaseSandbox, ReleaseGVisorInstaller}
	}
	return []string{ReleaseManager, ReleaseSandbox}
}

// ReleaseStackFile returns the stack file b with the release written into it: the registry,
// the images the stack's cloud runs, and the changes. name names the file in messages.
func ReleaseStackFile(b []byte, name, registry string, imgs ReleaseImages) ([]byte, []Change, error) {
	f, err := parseStack(b, name)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrRelease, err)
	}
	cfg := mapValue(f.doc.Content[0], "config")
	var changes []Change
	set := func(parent *yaml.Node, path []string, key, value string, after string) {
		old := setScalar(parent, key, value, after)
		if old != value {
			changes = append(changes, Change{Key: strings.Join(path, "."), Old: old, New: value})
		}
	}
	set(cfg, []string{RegistryKey}, RegistryKey, registry, Namespace+":cloud")
	images := ensureMapping(cfg, Namespace+":images", RegistryKey)
	for _, n := range NeededImages(f.cloud) {
		ref, ok := imgs[n]
		if !ok {
			return nil, nil, fmt.Errorf("%w: %s runs the %s image, which the release lacks", ErrRelease, name, n)
		}
		if err := components.ValidateImage(ref); err != nil {
			return nil, nil, fmt.Errorf("%w: image %s: %v", ErrRelease, n, err)
		}
		if !strings.HasPrefix(ref, registry+"/") {
			return nil, nil, fmt.Errorf("%w: image %s %s is not in registry %s", ErrRelease, n, ref, registry)
		}
		switch n {
		case ReleaseManager, ReleaseSandbox:
			set(images, []string{Namespace + ":images", n}, n, ref, "")
		case ReleaseGVisorInstaller:
			gv := ensureMapping(cfg, Namespace+":gvisor", "")
			set(gv, []string{Namespace + ":gvisor", "installerImage"}, "installerImage", ref, "")
		}
	}
	if len(changes) == 0 {
		return b, nil, nil
	}
	out, err := encodeStack(&f.doc, name)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrRelease, err)
	}
	return out, changes, nil
}

// WriteRelease writes the release into every stack's file. All files are computed first and
// nothing is written when any of them fails; each file is replaced atomically. It returns the
// changes by stack.
func WriteRelease(stacksDir string, stacks []string, registry string, imgs ReleaseImages) (map[string][]Change, error) {
	outs := map[string][]byte{}
	all := map[string][]Change{}
	for _, s := range stacks {
		p := StackFile(stacksDir, s)
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("%w: reading stack %s: %w", ErrRelease, s, err)
		}
		out, changes, err := ReleaseStackFile(b, displayPath(p), registry, imgs)
		if err != nil {
			return nil, err
		}
		all[s] = changes
		if len(changes) > 0 {
			outs[s] = out
		}
	}
	for _, s := range stacks {
		if out, ok := outs[s]; ok {
			if err := writeFileAtomic(StackFile(stacksDir, s), out); err != nil {
				return nil, fmt.Errorf("%w: writing %s: %w", ErrRelease, StackFile(stacksDir, s), err)
			}
		}
	}
	return all, nil
}

// setScalar sets key in mapping m to the string value and returns the old value ("" when the
// key is new). A new key goes right after the key named after, or at the end.
func setScalar(m *yaml.Node, key, value, after string) string {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v := m.Content[i+1]
			old := ""
			if v.Kind == yaml.ScalarNode {
				old = v.Value
			}
			*v = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value, LineComment: v.LineComment, HeadComment: v.HeadComment}
			return old
		}
	}
	insertPair(m, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}, after)
	return ""
}

// ensureMapping returns the mapping at key in m, creating it (after the key named after, or
// at the end) when it is missing or empty.
func ensureMapping(m *yaml.Node, key, after string) *yaml.Node {
	if v := mapValue(m, key); v != nil {
		if v.Kind != yaml.MappingNode {
			*v = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", HeadComment: v.HeadComment, LineComment: v.LineComment}
		}
		v.Style = 0 // block style, also for a `{}` placeholder
		return v
	}
	v := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	insertPair(m, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v, after)
	return v
}

func insertPair(m *yaml.Node, k, v *yaml.Node, after string) {
	at := len(m.Content)
	for i := 0; i+1 < len(m.Content); i += 2 {
		if after != "" && m.Content[i].Value == after {
			at = i + 2
		}
	}
	m.Content = append(m.Content[:at], append([]*yaml.Node{k, v}, m.Content[at:]...)...)
}
